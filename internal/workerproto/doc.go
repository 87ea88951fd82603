// Package workerproto is the worker protocol: what the control plane
// asks of a worker and what the worker answers, defined once.
//
// # Verbs
//
// Every management call is a verb (see [Def]): a method and a path below
// [PathPrefix], a deadline, whether it may be retried, and its request
// and response types. One table of verbs drives both sides: [Mount]
// serves them from any [Service] (the worker implements it), and
// [Client] calls them, either over HTTP ([NewClient]) or on a Service in
// the same process ([NewLocal]). Either way a call runs under its verb's
// deadline (or the caller's, if shorter), and an idempotent verb is tried
// again, a bounded number of times with backoff, after a transport
// failure (the worker was not reached or the connection broke); never
// after an answer of the worker's, whatever it says.
//
// The data plane (exec, processes, files, ports) is not made of verbs: it
// streams, and the control plane passes its requests through to the
// worker's routes below [DataPattern] as they are.
//
// # Wire rules
//
// Requests and responses are JSON. A worker decodes requests strictly:
// an unknown field, a second value or trailing data is an
// InvalidArgument error, so a request is never half understood. A client
// decodes answers leniently: fields it does not know are ignored.
//
// # Versions
//
// [Version] is the protocol's major version, an integer. A control plane
// and a worker are compatible when they speak the same Version (see
// [CheckVersion]); the worker states its own at registration and in
// [Status]. Changes an older peer copes with keep the version: a new
// field in an answer (clients ignore it), a new request field that is
// omitted when unused and that a control plane sends only to workers
// whose [Capabilities] say they understand it, a new verb used on the
// same condition. Anything else (a field removed, renamed or given another
// meaning, a verb's method, path or answer changed, a verb removed) is a
// new Version.
package workerproto
