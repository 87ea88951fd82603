package sandbox

import "slices"

// Lifecycle event types: what the control plane records about a sandbox
// (the store's events, the events API, webhooks subscribing by type).
// Their values are wire format and never change.
//
// The state-change types are recorded by the store whenever a sandbox's
// state changes, named by EventOf; the others are recorded by the
// control plane when something that is not a state change completes.
const (
	// State changes (see EventOf).
	EventCreated    = "created"    // the record was created (State: its first state)
	EventRunning    = "running"    // a create or restore finished: the VM runs
	EventPaused     = "paused"     // vCPUs stopped
	EventResumed    = "resumed"    // a paused sandbox runs again
	EventResuming   = "resuming"   // a suspended sandbox is being started again
	EventRestoring  = "restoring"  // its VM is being replaced from a snapshot
	EventRecovering = "recovering" // its worker was lost; being restored elsewhere
	EventRecovered  = "recovered"  // a recovery finished: the VM runs
	EventStopping   = "stopping"   // being torn down (delete, timeout, suspend)
	EventStopped    = "stopped"    // no VM; the record remains
	EventSuspended  = "suspended"  // no VM; a snapshot holds its memory and disk
	EventFailed     = "failed"     // a create or the VM failed
	EventDeleted    = "deleted"    // the record is gone

	// Not state changes.
	EventCheckpointed = "checkpointed" // a checkpoint completed; Data: snapshot_id, trigger
	EventSnapshotted  = "snapshotted"  // a user snapshot completed; Data: snapshot_id
	EventRestored     = "restored"     // a restore in place completed; Data: snapshot_id
	EventForked       = "forked"       // a fork of it was made; Data: child_id (the child gets its own "created")
	EventExpired      = "expired"      // its timeout passed; it is deleted or suspended next
)

// EventTypes lists every event type, in the order of the list above.
var EventTypes = []string{
	EventCreated, EventRunning, EventPaused, EventResumed, EventResuming, EventRestoring,
	EventRecovering, EventRecovered, EventStopping, EventStopped, EventSuspended, EventFailed, EventDeleted,
	EventCheckpointed, EventSnapshotted, EventRestored, EventForked, EventExpired,
}

// ValidEventType reports whether t is one of EventTypes.
func ValidEventType(t string) bool { return slices.Contains(EventTypes, t) }

// EventOf returns the type of the event a change of state from one
// state to the other is recorded as, or "" if the state does not change.
// It names what was reached, and for a few states where the sandbox came
// from: running after paused is "resumed", after recovering "recovered";
// creating after suspended is "resuming", after anything else (a running,
// paused or stopped VM replaced from a snapshot) "restoring".
func EventOf(from, to State) string {
	if from == to {
		return ""
	}
	switch to {
	case Running:
		switch from {
		case Paused:
			return EventResumed
		case Recovering:
			return EventRecovered
		}
		return EventRunning
	case Creating:
		if from == Suspended {
			return EventResuming
		}
		return EventRestoring
	case Paused:
		return EventPaused
	case Recovering:
		return EventRecovering
	case Stopping:
		return EventStopping
	case Stopped:
		return EventStopped
	case Suspended:
		return EventSuspended
	case Failed:
		return EventFailed
	case Deleted:
		return EventDeleted
	}
	return ""
}
