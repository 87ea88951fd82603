package sandbox

import "testing"

func TestEventOf(t *testing.T) {
	for _, tc := range []struct {
		from, to State
		want     string
	}{
		{Creating, Running, EventRunning},
		{Paused, Running, EventResumed},
		{Recovering, Running, EventRecovered},
		{Suspended, Creating, EventResuming},
		{Running, Creating, EventRestoring},
		{Paused, Creating, EventRestoring},
		{Stopped, Creating, EventRestoring},
		{Running, Paused, EventPaused},
		{Running, Recovering, EventRecovering},
		{Failed, Stopping, EventStopping},
		{Stopping, Stopped, EventStopped},
		{Stopping, Suspended, EventSuspended},
		{Creating, Failed, EventFailed},
		{Stopping, Deleted, EventDeleted},
		{Running, Running, ""},
	} {
		if got := EventOf(tc.from, tc.to); got != tc.want {
			t.Errorf("EventOf(%s, %s) = %q, want %q", tc.from, tc.to, got, tc.want)
		}
	}
	// Every transition the table allows has a type, and a known one.
	for from, tos := range transitions {
		for _, to := range tos {
			if got := EventOf(from, to); !ValidEventType(got) {
				t.Errorf("EventOf(%s, %s) = %q, not one of EventTypes", from, to, got)
			}
		}
	}
	seen := map[string]bool{}
	for _, typ := range EventTypes {
		if seen[typ] {
			t.Errorf("EventTypes lists %q twice", typ)
		}
		seen[typ] = true
	}
}
