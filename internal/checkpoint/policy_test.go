package checkpoint

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/internal/httpapi"
)

func TestFromAPIDefaultsAndRoundTrip(t *testing.T) {
	p, err := FromAPI("checkpoints", api.CheckpointPolicy{Every: "5m", AfterExec: true, KeepFor: "24h"})
	if err != nil {
		t.Fatalf("FromAPI = %v", err)
	}
	want := Policy{Every: 5 * time.Minute, AfterExec: true, MinExec: DefaultMinExec, Keep: DefaultKeep, KeepFor: 24 * time.Hour}
	if p != want {
		t.Fatalf("FromAPI = %+v, want %+v", p, want)
	}
	again, err := FromAPI("checkpoints", p.API())
	if err != nil || again != p {
		t.Fatalf("FromAPI(API()) = %+v, %v; want %+v", again, err, p)
	}
	if off, _ := FromAPI("x", api.CheckpointPolicy{}); !off.Off() {
		t.Errorf("the empty policy is not off: %+v", off)
	}
	if on, _ := FromAPI("x", api.CheckpointPolicy{AfterExec: true}); on.Off() {
		t.Errorf("an after_exec policy is off")
	}
}

func TestFromAPIRejects(t *testing.T) {
	for _, tc := range []struct {
		p     api.CheckpointPolicy
		field string
	}{
		{api.CheckpointPolicy{Every: "10"}, "checkpoints.every"},
		{api.CheckpointPolicy{Every: "-5s"}, "checkpoints.every"},
		{api.CheckpointPolicy{Every: "100ms"}, "checkpoints.every"},
		{api.CheckpointPolicy{Every: "9000h"}, "checkpoints.every"},
		{api.CheckpointPolicy{Every: strings.Repeat("1", 40) + "s"}, "checkpoints.every"},
		{api.CheckpointPolicy{MinExec: "soon"}, "checkpoints.min_exec"},
		{api.CheckpointPolicy{Keep: -1}, "checkpoints.keep"},
		{api.CheckpointPolicy{Keep: MaxKeep + 1}, "checkpoints.keep"},
		{api.CheckpointPolicy{KeepFor: "-1h"}, "checkpoints.keep_for"},
		{api.CheckpointPolicy{KeepFor: "100000h"}, "checkpoints.keep_for"},
	} {
		_, err := FromAPI("checkpoints", tc.p)
		var fe *httpapi.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("FromAPI(%+v) = %v, want an error on %s", tc.p, err, tc.field)
		}
	}
}

func TestParse(t *testing.T) {
	p, err := Parse("every=5m, after_exec ,keep=20,keep_for=24h,min_exec=3s")
	want := api.CheckpointPolicy{Every: "5m", AfterExec: true, Keep: 20, KeepFor: "24h", MinExec: "3s"}
	if err != nil || p != want {
		t.Fatalf("Parse = %+v, %v; want %+v", p, err, want)
	}
	for _, s := range []string{"", "off", "  "} {
		if p, err := Parse(s); err != nil || p != (api.CheckpointPolicy{}) {
			t.Errorf("Parse(%q) = %+v, %v; want the empty policy", s, p, err)
		}
	}
	if p, err := Parse("after_exec=false,every=1m"); err != nil || p.AfterExec || p.Every != "1m" {
		t.Errorf("Parse(after_exec=false) = %+v, %v", p, err)
	}
	for _, s := range []string{"every", "keep=x", "often=1s", "after_exec=maybe", "every=5m,,keep=2"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = nil error", s)
		}
	}
}

func TestDue(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	p := Policy{Every: time.Minute, AfterExec: true, MinExec: 2 * time.Second, Keep: 5}
	long := &Exec{Command: "make", Started: t0.Add(10 * time.Second), Ended: t0.Add(20 * time.Second)}
	short := &Exec{Command: "ls", Started: t0.Add(10 * time.Second), Ended: t0.Add(11 * time.Second)}
	for _, tc := range []struct {
		name    string
		now     time.Time
		exec    *Exec
		trigger string
	}{
		{"not yet", t0.Add(30 * time.Second), nil, ""},
		{"schedule", t0.Add(time.Minute), nil, api.CheckpointSchedule},
		{"long command", t0.Add(30 * time.Second), long, api.CheckpointExec},
		{"short command", t0.Add(30 * time.Second), short, ""},
		{"command before the last checkpoint", t0.Add(30 * time.Second), &Exec{Started: t0.Add(-time.Hour), Ended: t0.Add(-time.Second)}, ""},
	} {
		trigger, due := p.Due(tc.now, t0, tc.exec)
		if trigger != tc.trigger || due != (tc.trigger != "") {
			t.Errorf("%s: Due = %q, %v; want %q", tc.name, trigger, due, tc.trigger)
		}
	}
	noSchedule := Policy{AfterExec: true, MinExec: time.Second}
	if _, due := noSchedule.Due(t0.Add(100*time.Hour), t0, nil); due {
		t.Errorf("a policy without every came due on a schedule")
	}
}

func TestPrune(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	var all []Entry
	for i := range 6 { // c0 oldest (t0), c5 newest (t0+5h)
		all = append(all, Entry{ID: "c" + string(rune('0'+i)), Created: t0.Add(time.Duration(i) * time.Hour)})
	}
	slices.Reverse(all) // Prune sorts for itself
	now := t0.Add(6 * time.Hour)
	for _, tc := range []struct {
		name string
		p    Policy
		want []string
	}{
		{"keep 3", Policy{Keep: 3}, []string{"c2", "c1", "c0"}},
		{"keep all", Policy{Keep: 20}, nil},
		{"keep for 3h30m", Policy{Keep: 20, KeepFor: 3*time.Hour + 30*time.Minute}, []string{"c2", "c1", "c0"}},
		{"both", Policy{Keep: 2, KeepFor: 5 * time.Hour}, []string{"c3", "c2", "c1", "c0"}},
		{"the newest stays", Policy{Keep: 20, KeepFor: time.Minute}, []string{"c4", "c3", "c2", "c1", "c0"}},
	} {
		if got := tc.p.Prune(now, all); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Prune = %v, want %v", tc.name, got, tc.want)
		}
	}
}
