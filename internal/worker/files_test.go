package worker

import "testing"

func TestParseRange(t *testing.T) {
	const size = 1000
	tests := []struct {
		h      string
		off, n int64
		ok     bool
	}{
		{"bytes=0-99", 0, 100, true},
		{"bytes=990-", 990, 10, true},
		{"bytes=-10", 990, 10, true},
		{"bytes=-5000", 0, 1000, true},
		{"bytes=995-2000", 995, 5, true},
		{"bytes=1000-", 1000, 0, true}, // unsatisfiable
		{"bytes=5-4", 0, 0, false},
		{"bytes=0-1,5-6", 0, 0, false},
		{"items=0-1", 0, 0, false},
		{"bytes=x-1", 0, 0, false},
		{"bytes=-", 0, 0, false},
	}
	for _, tt := range tests {
		off, n, ok := parseRange(tt.h, size)
		if off != tt.off || n != tt.n || ok != tt.ok {
			t.Errorf("parseRange(%q, %d) = %d, %d, %v; want %d, %d, %v", tt.h, size, off, n, ok, tt.off, tt.n, tt.ok)
		}
	}
}
