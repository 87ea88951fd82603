package sandbox

import (
	"errors"
	"testing"

	"space/internal/errkind"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		from, to State
		want     error
	}{
		{Creating, Running, nil},
		{Running, Paused, nil},
		{Paused, Running, nil},
		{Running, Stopping, nil},
		{Stopping, Deleted, nil},
		{Stopped, Creating, nil}, // restart from the last snapshot
		{Deleted, Running, ErrTransition},
		{Stopping, Suspended, nil}, // a suspend destroyed the VM
		{Suspended, Creating, nil}, // resume
		{Suspended, Deleted, nil},
		{Suspended, Running, ErrTransition}, // a resume creates first
		{Suspended, Stopping, ErrTransition},
		{Running, Suspended, ErrTransition}, // a suspend stops first
		{Suspended, Stopped, ErrTransition},
		{Running, Creating, nil}, // restore in place
		{Deleted, Creating, ErrTransition},
		{Paused, Paused, ErrTransition},
		{"bogus", Running, errkind.InvalidArgument},
		{Running, "bogus", errkind.InvalidArgument},
	}
	for _, tt := range tests {
		err := Check(tt.from, tt.to)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("Check(%s, %s) = %v, want %v", tt.from, tt.to, err, tt.want)
		}
	}
}

// TestEveryStateReachable keeps the table honest: every state but Creating
// is the target of some transition, and every state is listed.
func TestEveryStateReachable(t *testing.T) {
	reached := map[State]bool{Creating: true}
	for _, next := range transitions {
		for _, s := range next {
			reached[s] = true
		}
	}
	for _, s := range States {
		if !reached[s] {
			t.Errorf("state %s is never reached", s)
		}
		if !s.Valid() {
			t.Errorf("state %s listed but not in the table", s)
		}
	}
	if len(transitions) != len(States) {
		t.Errorf("table has %d states, States lists %d", len(transitions), len(States))
	}
}
