package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/store"
)

func newWebhook(team string) store.Webhook {
	return store.Webhook{ID: store.NewWebhookID(), TeamID: team, URL: "https://hooks.example/" + team,
		Secret: "whsec_" + team, Enabled: true}
}

func mustWebhook(t *testing.T, s store.Store, w store.Webhook) store.Webhook {
	t.Helper()
	got, err := s.CreateWebhook(t.Context(), w)
	if err != nil {
		t.Fatalf("setup: CreateWebhook(%s): %v", w.ID, err)
	}
	return got
}

func webhookIDs(ws []store.Webhook) []string {
	ids := []string{}
	for _, w := range ws {
		ids = append(ids, w.ID)
	}
	return ids
}

func testWebhookCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")

	in := newWebhook("t1")
	in.Types = []string{"sandbox.created", "sandbox.running"}
	in.Description = "ci notifications"
	created, err := s.CreateWebhook(ctx, in)
	if err != nil {
		t.Fatalf("CreateWebhook() = %v", err)
	}
	want := in
	want.Types = slices.Clone(in.Types)
	want.Created, want.Updated = created.Created, created.Created
	if diff := cmp.Diff(want, created); diff != "" {
		t.Errorf("CreateWebhook() (-want +got):\n%s", diff)
	}
	if created.Created.IsZero() {
		t.Errorf("CreateWebhook().Created is zero")
	}
	in.Types[0] = "evil" // the store keeps its own copy
	got, err := s.Webhook(ctx, "t1", want.ID)
	if err != nil {
		t.Fatalf("Webhook() = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Webhook() (-want +got):\n%s", diff)
	}
	if _, err := s.CreateWebhook(ctx, want); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateWebhook(same ID) = %v, want ErrAlreadyExists", err)
	}
	if _, err := s.CreateWebhook(ctx, newWebhook("nobody")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CreateWebhook(team that does not exist) = %v, want ErrNotFound", err)
	}

	allIn := newWebhook("t1") // every type, E2B's format
	allIn.Format = store.WebhookFormatE2B
	all := mustWebhook(t, s, allIn)
	if got, _ := s.Webhook(ctx, "t1", all.ID); got.Format != store.WebhookFormatE2B {
		t.Errorf("Webhook(e2b).Format = %q, want %q", got.Format, store.WebhookFormatE2B)
	}
	if all.Types != nil {
		t.Errorf("CreateWebhook(no types).Types = %v, want nil", all.Types)
	}
	off := newWebhook("t2")
	off.Enabled = false
	mustWebhook(t, s, off)
	other := mustWebhook(t, s, newWebhook("t2"))

	list, err := s.ListWebhooks(ctx, "t1")
	if err != nil {
		t.Fatalf("ListWebhooks(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.Webhook{want, all}, list); diff != "" {
		t.Errorf("ListWebhooks(t1) (-want +got):\n%s", diff)
	}
	if list, err := s.ListWebhooks(ctx, "t3"); err != nil || len(list) != 0 {
		t.Errorf("ListWebhooks(no hooks) = %v, %v; want none", list, err)
	}
	enabled, err := s.EnabledWebhooks(ctx)
	if err != nil {
		t.Fatalf("EnabledWebhooks() = %v", err)
	}
	if diff := cmp.Diff([]string{want.ID, all.ID, other.ID}, webhookIDs(enabled)); diff != "" {
		t.Errorf("EnabledWebhooks() (-want +got):\n%s", diff)
	}

	upd := got
	upd.URL, upd.Types, upd.Description, upd.Enabled = "https://new.example/x", nil, "", false
	upd.Secret, upd.Format = "whsec_rotated", store.WebhookFormatE2B // the format is not the user's to change
	upd.Cursor, upd.Failures = 99, 99                                // nor the delivery state
	after, err := s.UpdateWebhook(ctx, upd)
	if err != nil {
		t.Fatalf("UpdateWebhook() = %v", err)
	}
	wantUpd := want
	wantUpd.URL, wantUpd.Types, wantUpd.Description, wantUpd.Enabled, wantUpd.Updated = upd.URL, nil, "", false, after.Updated
	wantUpd.Secret = "whsec_rotated"
	if diff := cmp.Diff(wantUpd, after); diff != "" {
		t.Errorf("UpdateWebhook() (-want +got):\n%s", diff)
	}
	if after.Updated.Before(want.Updated) {
		t.Errorf("UpdateWebhook().Updated = %v, before %v", after.Updated, want.Updated)
	}
	if got, _ := s.Webhook(ctx, "t1", want.ID); !cmp.Equal(got, after) {
		t.Errorf("Webhook() after update = %+v, want %+v", got, after)
	}
	if _, err := s.UpdateWebhook(ctx, newWebhook("t1")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateWebhook(unknown) = %v, want ErrNotFound", err)
	}

	if _, err := s.AddWebhookDelivery(ctx, store.WebhookDelivery{WebhookID: all.ID, EventSeq: 1, EventType: "x", Attempt: 1, Delivered: true}, 0); err != nil {
		t.Fatalf("setup: AddWebhookDelivery() = %v", err)
	}
	if err := s.DeleteWebhook(ctx, "t1", all.ID); err != nil {
		t.Fatalf("DeleteWebhook() = %v", err)
	}
	if _, err := s.Webhook(ctx, "t1", all.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Webhook(deleted) = %v, want ErrNotFound", err)
	}
	if _, err := s.WebhookDeliveries(ctx, "t1", all.ID, 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("WebhookDeliveries(deleted) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteWebhook(ctx, "t1", all.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteWebhook(deleted) = %v, want ErrNotFound", err)
	}
}

func testWebhookTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	w := mustWebhook(t, s, newWebhook("t1"))

	if _, err := s.Webhook(ctx, "t2", w.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Webhook(other team) = %v, want ErrNotFound", err)
	}
	theirs := w
	theirs.TeamID, theirs.URL = "t2", "https://stolen.example/"
	if _, err := s.UpdateWebhook(ctx, theirs); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateWebhook(other team) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteWebhook(ctx, "t2", w.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteWebhook(other team) = %v, want ErrNotFound", err)
	}
	if _, err := s.WebhookDeliveries(ctx, "t2", w.ID, 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("WebhookDeliveries(other team) = %v, want ErrNotFound", err)
	}
	if list, err := s.ListWebhooks(ctx, "t2"); err != nil || len(list) != 0 {
		t.Errorf("ListWebhooks(t2) = %v, %v; want none", list, err)
	}
	if got, err := s.Webhook(ctx, "t1", w.ID); err != nil || !cmp.Equal(got, w) {
		t.Errorf("Webhook(t1) after the other team's tries = %+v, %v; want it unchanged", got, err)
	}
}

func testWebhookDeliveries(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	w := mustWebhook(t, s, newWebhook("t1"))
	add := func(d store.WebhookDelivery, disableAfter int) store.Webhook {
		t.Helper()
		d.WebhookID = w.ID
		if d.EventType == "" {
			d.EventType = "sandbox.created"
		}
		got, err := s.AddWebhookDelivery(ctx, d, disableAfter)
		if err != nil {
			t.Fatalf("AddWebhookDelivery(%+v) = %v", d, err)
		}
		return got
	}

	got := add(store.WebhookDelivery{EventSeq: 5, Attempt: 1, StatusCode: 500, Error: "receiver answered 500", Duration: 1500 * time.Millisecond}, 3)
	if got.Cursor != 0 || got.Failures != 1 || !got.Enabled {
		t.Errorf("after a failed attempt: cursor %d failures %d enabled %v, want 0 1 true", got.Cursor, got.Failures, got.Enabled)
	}
	got = add(store.WebhookDelivery{EventSeq: 5, Attempt: 2, StatusCode: 200, Delivered: true}, 3)
	if got.Cursor != 5 || got.Failures != 0 {
		t.Errorf("after a delivered attempt: cursor %d failures %d, want 5 0", got.Cursor, got.Failures)
	}
	got = add(store.WebhookDelivery{EventSeq: 3, Attempt: 1, StatusCode: 204, Delivered: true}, 3)
	if got.Cursor != 5 {
		t.Errorf("after delivering an earlier event: cursor %d, want 5 (it never goes back)", got.Cursor)
	}
	got = add(store.WebhookDelivery{EventType: "ping", Attempt: 1, Error: "connection refused"}, 1)
	if got.Cursor != 5 || got.Failures != 0 || !got.Enabled {
		t.Errorf("after a failed ping: cursor %d failures %d enabled %v, want it unchanged", got.Cursor, got.Failures, got.Enabled)
	}
	for i := 1; i <= 3; i++ {
		got = add(store.WebhookDelivery{EventSeq: 6, Attempt: i, Error: "dial tcp: connection refused"}, 3)
	}
	if got.Enabled || got.Failures != 3 || !strings.Contains(got.DisabledReason, "connection refused") || !strings.Contains(got.DisabledReason, "3 consecutive") {
		t.Errorf("after 3 failures with disableAfter 3: %+v, want disabled with a reason naming the last error", got)
	}
	if stored, _ := s.Webhook(ctx, "t1", w.ID); !cmp.Equal(stored, got) {
		t.Errorf("Webhook() = %+v, want %+v", stored, got)
	}
	if !got.Updated.Equal(w.Updated) {
		t.Errorf("deliveries changed Updated from %v to %v", w.Updated, got.Updated)
	}
	if enabled, _ := s.EnabledWebhooks(ctx); len(enabled) != 0 {
		t.Errorf("EnabledWebhooks() = %v, want none", webhookIDs(enabled))
	}

	log, err := s.WebhookDeliveries(ctx, "t1", w.ID, 0)
	if err != nil {
		t.Fatalf("WebhookDeliveries() = %v", err)
	}
	if len(log) != 7 {
		t.Fatalf("WebhookDeliveries() = %d entries, want 7", len(log))
	}
	oldest := log[6]
	want := store.WebhookDelivery{ID: oldest.ID, WebhookID: w.ID, EventSeq: 5, EventType: "sandbox.created", Attempt: 1, Time: oldest.Time,
		StatusCode: 500, Error: "receiver answered 500", Duration: 1500 * time.Millisecond}
	if diff := cmp.Diff(want, oldest); diff != "" {
		t.Errorf("oldest delivery (-want +got):\n%s", diff)
	}
	if oldest.Time.IsZero() || time.Since(oldest.Time) > time.Minute {
		t.Errorf("delivery time %v, want about now", oldest.Time)
	}
	for i := 1; i < len(log); i++ {
		if log[i].ID >= log[i-1].ID {
			t.Fatalf("WebhookDeliveries() IDs %d then %d, want newest first", log[i-1].ID, log[i].ID)
		}
	}
	if last2, _ := s.WebhookDeliveries(ctx, "t1", w.ID, 2); len(last2) != 2 || last2[0].ID != log[0].ID {
		t.Errorf("WebhookDeliveries(limit 2) = %v, want the 2 newest", last2)
	}

	// Re-enabling clears the failures and the reason the user sends.
	got.Enabled, got.DisabledReason = true, ""
	got, err = s.UpdateWebhook(ctx, got)
	if err != nil || !got.Enabled || got.Failures != 0 || got.DisabledReason != "" {
		t.Errorf("UpdateWebhook(enable) = %+v, %v; want enabled with 0 failures", got, err)
	}

	// The log keeps the last WebhookDeliveriesKept.
	for i := range store.WebhookDeliveriesKept {
		add(store.WebhookDelivery{EventSeq: int64(10 + i), Attempt: 1, StatusCode: 200, Delivered: true}, 0)
	}
	log, err = s.WebhookDeliveries(ctx, "t1", w.ID, 0)
	if err != nil || len(log) != store.WebhookDeliveriesKept || log[len(log)-1].EventSeq != 10 {
		t.Errorf("WebhookDeliveries() after %d more = %d entries (oldest event %d), %v; want %d, oldest event 10",
			store.WebhookDeliveriesKept, len(log), log[len(log)-1].EventSeq, err, store.WebhookDeliveriesKept)
	}

	if _, err := s.AddWebhookDelivery(ctx, store.WebhookDelivery{WebhookID: store.NewWebhookID(), EventSeq: 1, EventType: "x", Attempt: 1}, 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AddWebhookDelivery(unknown webhook) = %v, want ErrNotFound", err)
	}
	add(store.WebhookDelivery{EventSeq: 1000, Attempt: 1, Error: strings.Repeat("x", 5000)}, 0)
	if log, _ := s.WebhookDeliveries(ctx, "t1", w.ID, 1); len(log) != 1 || len(log[0].Error) != 1024 {
		t.Errorf("a 5000-byte error is kept as %d bytes, want 1024", len(log[0].Error))
	}
}

func testWebhookBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	bad := []struct {
		name string
		mod  func(*store.Webhook)
	}{
		{"id", func(w *store.Webhook) { w.ID = "sbx_abc" }},
		{"no url", func(w *store.Webhook) { w.URL = "" }},
		{"long url", func(w *store.Webhook) { w.URL = "https://x/" + strings.Repeat("a", 2048) }},
		{"no secret", func(w *store.Webhook) { w.Secret = "" }},
		{"empty type", func(w *store.Webhook) { w.Types = []string{""} }},
		{"long description", func(w *store.Webhook) { w.Description = strings.Repeat("d", 257) }},
		{"format", func(w *store.Webhook) { w.Format = "slack" }},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			w := newWebhook("t1")
			tt.mod(&w)
			if _, err := s.CreateWebhook(ctx, w); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("CreateWebhook() = %v, want ErrInvalid", err)
			}
		})
	}
	if list, _ := s.ListWebhooks(ctx, "t1"); len(list) != 0 {
		t.Errorf("ListWebhooks() after bad creates = %v, want none", webhookIDs(list))
	}
	w := mustWebhook(t, s, newWebhook("t1"))
	for _, d := range []store.WebhookDelivery{
		{WebhookID: w.ID, EventSeq: 1, EventType: "x", Attempt: 0},
		{WebhookID: w.ID, EventSeq: -1, EventType: "x", Attempt: 1},
		{WebhookID: w.ID, EventSeq: 1, EventType: "", Attempt: 1},
		{WebhookID: "nope", EventSeq: 1, EventType: "x", Attempt: 1},
	} {
		if _, err := s.AddWebhookDelivery(ctx, d, 0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("AddWebhookDelivery(%+v) = %v, want ErrInvalid", d, err)
		}
	}
	if log, _ := s.WebhookDeliveries(ctx, "t1", w.ID, 0); len(log) != 0 {
		t.Errorf("WebhookDeliveries() after bad adds = %d entries, want 0", len(log))
	}
}
