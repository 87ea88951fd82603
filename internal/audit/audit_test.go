package audit_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"space/internal/audit"
	"space/internal/store"
)

// chain makes a log of n entries after anchor, as a store would.
func chain(anchor store.AuditAnchor, n int) []store.AuditEntry {
	var out []store.AuditEntry
	seq, hash := anchor.Seq, anchor.Hash
	at := time.Date(2026, 12, 7, 19, 0, 0, 0, time.UTC)
	for i := range n {
		e := store.AuditEntry{RequestID: fmt.Sprintf("req_%d", i), KeyID: "key_1", TeamID: "t1", Source: "127.0.0.1:1",
			Method: "DELETE", Route: "/v1/sandboxes/{id}", Targets: map[string]string{"id": fmt.Sprintf("sbx_%d", i)},
			Code: 204, Outcome: store.AuditOK}
		e = store.ChainAudit(e, seq, hash, at.Add(time.Duration(i)*time.Millisecond))
		out = append(out, e)
		seq, hash = e.Seq, e.Hash
	}
	return out
}

func TestVerify(t *testing.T) {
	anchor := store.AuditAnchor{Seq: 41, Hash: []byte("0123456789abcdef0123456789abcdef")}
	for _, tc := range []struct {
		name   string
		anchor store.AuditAnchor
		edit   func([]store.AuditEntry) []store.AuditEntry
		seq    int64 // the entry named; 0 = intact
	}{
		{"intact", store.AuditAnchor{}, nil, 0},
		{"intact after an anchor", anchor, nil, 0},
		{"empty", store.AuditAnchor{}, func([]store.AuditEntry) []store.AuditEntry { return nil }, 0},
		{"edited code", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry { es[2].Code = 200; return es }, 3},
		{"edited target", anchor, func(es []store.AuditEntry) []store.AuditEntry {
			es[0].Targets = map[string]string{"id": "x"}
			return es
		}, 42},
		{"edited time", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry {
			es[4].Time = es[4].Time.Add(time.Microsecond)
			return es
		}, 5},
		{"edited and rehashed", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry {
			es[1].KeyID = "key_2"
			es[1].Hash = store.AuditHash(es[1].Prev, es[1])
			return es
		}, 3},
		{"deleted", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry { return slices.Delete(es, 2, 3) }, 4},
		{"deleted first", anchor, func(es []store.AuditEntry) []store.AuditEntry { return es[1:] }, 43},
		{"swapped", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry { es[1], es[2] = es[2], es[1]; return es }, 3},
		{"swapped seqs too", store.AuditAnchor{}, func(es []store.AuditEntry) []store.AuditEntry {
			es[1], es[2] = es[2], es[1]
			es[1].Seq, es[2].Seq = 2, 3
			return es
		}, 2},
		{"wrong anchor", store.AuditAnchor{Seq: 41, Hash: []byte("another")}, nil, 42},
		{"anchor not given", store.AuditAnchor{}, func([]store.AuditEntry) []store.AuditEntry { return chain(anchor, 3) }, 42},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := chain(tc.anchor, 5)
			if tc.name == "wrong anchor" {
				log = chain(anchor, 5)
			}
			if tc.edit != nil {
				log = tc.edit(log)
			}
			r, err := audit.Verify(log, tc.anchor)
			if tc.seq == 0 {
				if err != nil || r.Entries != int64(len(log)) {
					t.Errorf("Verify() = %+v, %v; want %d entries intact", r, err, len(log))
				}
				if len(log) > 0 && (r.First != log[0].Seq || r.Last != log[len(log)-1].Seq) {
					t.Errorf("Verify() = seqs %d to %d, want %d to %d", r.First, r.Last, log[0].Seq, log[len(log)-1].Seq)
				}
				return
			}
			if !errors.Is(err, audit.ErrBroken) || !strings.HasPrefix(err.Error(), fmt.Sprintf("seq %d:", tc.seq)) {
				t.Errorf("Verify() = %v, want %v naming seq %d", err, audit.ErrBroken, tc.seq)
			}
		})
	}
}

// TestCanonical pins the hashed encoding: a verifier written from the
// documentation must produce these bytes.
func TestCanonical(t *testing.T) {
	e := store.AuditEntry{Seq: 7, Time: time.Date(2026, 12, 7, 19, 0, 0, 120000, time.FixedZone("x", 3600)),
		RequestID: "req_1", KeyID: "key_a", TeamID: "t1", Source: "[::1]:5000", Method: "POST",
		Route: "/v1/sandboxes/{id}/fork", Targets: map[string]string{"id": "sbx_b", "created": "sbx_<&>"},
		Code: 201, Outcome: "ok", Prev: []byte{1}, Hash: []byte{2}}
	want := `{"seq":7,"time":"2026-12-07T18:00:00.00012Z","request_id":"req_1","key_id":"key_a","team_id":"t1","source":"[::1]:5000","method":"POST","route":"/v1/sandboxes/{id}/fork","targets":{"created":"sbx_<&>","id":"sbx_b"},"code":201,"outcome":"ok"}`
	if got := string(store.CanonicalAudit(e)); got != want {
		t.Errorf("CanonicalAudit() =\n%s\nwant\n%s", got, want)
	}
	e.Targets = nil
	if got := string(store.CanonicalAudit(e)); !strings.Contains(got, `"targets":{},`) {
		t.Errorf("CanonicalAudit(no targets) = %s, want targets {}", got)
	}
}
