package server

import (
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestProcTableForgetsOldestExited(t *testing.T) {
	tab := newProcTable(slog.New(slog.DiscardHandler), 0)
	tab.maxExited = 2
	var ps []*process
	for range 5 {
		p := &process{out: newOutputLog(10, 10)}
		if err := tab.insert(p); err != nil {
			t.Fatalf("insert() = %v", err)
		}
		tab.wg.Done() // no supervisor runs here
		ps = append(ps, p)
	}
	// 1 and 4 run on; 2, 3 and 5 exit in this order.
	for _, i := range []int{1, 2, 4} {
		tab.finished(ps[i])
	}
	var ids []int64
	for _, p := range tab.list() {
		ids = append(ids, p.id)
	}
	if diff := cmp.Diff([]int64{1, 3, 4, 5}, ids); diff != "" {
		t.Errorf("ids after 3 exits with room for 2 (-want +got):\n%s", diff)
	}
	if _, err := tab.get(2); err == nil {
		t.Errorf("get(2) = nil error, want the forgotten process not found")
	}
	tab.close()
	if err := tab.insert(&process{out: newOutputLog(10, 10)}); err == nil {
		t.Errorf("insert() after close = nil, want an error")
	}
}
