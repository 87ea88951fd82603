// Package webhook pushes a team's lifecycle events to the URLs it
// registered: signed (HMAC-SHA256, see [Verify]), in order and at least
// once per webhook, never to an address inside the control plane's own
// network (see [Guard]).
//
// A [Dispatcher] runs on the leader replica. It gives every enabled
// webhook its own goroutine, which reads the events after the webhook's
// cursor from a [Source], POSTs each with a [Sender], and logs every
// attempt through [Hooks]; the store moves the cursor only past an event
// the receiver answered 2xx to. Failed attempts are retried with
// exponential backoff, and a webhook that fails too often in a row is
// disabled until its owner enables it again.
package webhook
