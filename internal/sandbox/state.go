// Package sandbox holds what every layer means by a sandbox's lifecycle:
// its states and the one table of transitions between them.
//
// The worker checks a transition with Check before it persists the new
// state; the store records it; nothing else decides what may follow what.
package sandbox

import (
	"fmt"

	"space/internal/errkind"
)

// State is the lifecycle state of a sandbox. Its string value is stored
// and sent over the API, and never changes.
type State string

// The states.
const (
	Creating State = "creating" // VM being set up (or replaced by a restore); a crash here rolls back or completes
	Running  State = "running"  // the VM runs and its agent answers
	Paused   State = "paused"   // vCPUs stopped; memory kept
	Stopping State = "stopping" // being torn down (rm, TTL expiry, suspend)
	Stopped  State = "stopped"  // no VM; the record (and snapshots) remain
	// Suspended: no VM; a snapshot in the chunk store holds its memory and
	// disk, and a resume starts it again from there, on any worker.
	Suspended State = "suspended"
	// Recovering: its worker was lost, and it is being restored on
	// another from its latest checkpoint (same ID); data-plane requests
	// get 503 until it runs again.
	Recovering State = "recovering"
	Failed     State = "failed"  // a create or the VM failed; resources released
	Deleted    State = "deleted" // gone; kept only as a tombstone
)

// States lists every state.
var States = []State{Creating, Running, Paused, Stopping, Stopped, Suspended, Recovering, Failed, Deleted}

func (s State) String() string { return string(s) }

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// transitions is the table: from each state, the states that may follow.
var transitions = map[State][]State{
	Creating:   {Running, Failed, Stopping},
	Running:    {Paused, Stopping, Failed, Creating, Recovering}, // Creating: restored from a snapshot in place
	Paused:     {Running, Stopping, Failed, Creating, Recovering},
	Recovering: {Running, Failed, Stopping},
	Stopping:   {Stopped, Suspended, Deleted, Failed}, // Suspended: a suspend's VM is gone
	Stopped:    {Creating, Deleted},
	Suspended:  {Creating, Deleted}, // Creating: a resume
	Failed:     {Stopping, Deleted},
	Deleted:    {},
}

// ErrTransition is returned by Check for a transition the table forbids.
var ErrTransition = fmt.Errorf("invalid sandbox state transition: %w", errkind.FailedPrecondition)

// Check returns nil if a sandbox may go from one state to the other, else
// an error wrapping ErrTransition (a caller asking for it gets
// FailedPrecondition).
func Check(from, to State) error {
	next, ok := transitions[from]
	if !ok {
		return fmt.Errorf("unknown state %q: %w", from, errkind.InvalidArgument)
	}
	for _, s := range next {
		if s == to {
			return nil
		}
	}
	if !to.Valid() {
		return fmt.Errorf("unknown state %q: %w", to, errkind.InvalidArgument)
	}
	return fmt.Errorf("%s -> %s: %w", from, to, ErrTransition)
}
