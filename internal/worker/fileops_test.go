package worker

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/agent/proto"
)

func TestPermissions(t *testing.T) {
	tests := []struct {
		typ  proto.FileType
		mode uint32
		want string
	}{
		{proto.FileRegular, 0o755, "-rwxr-xr-x"},
		{proto.FileRegular, 0o640, "-rw-r-----"},
		{proto.FileDir, 0o1777, "drwxrwxrwt"},
		{proto.FileDir, 0o1776, "drwxrwxrwT"},
		{proto.FileSymlink, 0o777, "lrwxrwxrwx"},
		{proto.FileRegular, 0o4755, "-rwsr-xr-x"},
		{proto.FileRegular, 0o2644, "-rw-r-Sr--"},
		{proto.FileOther, 0o600, "?rw-------"},
	}
	for _, tt := range tests {
		if got := permissions(tt.typ, tt.mode); got != tt.want {
			t.Errorf("permissions(%s, %04o) = %q, want %q", tt.typ, tt.mode, got, tt.want)
		}
	}
}

func TestFileInfoNames(t *testing.T) {
	got := fileInfo("/a/b", proto.FileInfo{Name: "b", Type: proto.FileRegular, UID: 1000, GID: 100, Group: "users", Mode: 0o644})
	if got.Owner != "1000" || got.Group != "users" || got.Path != "/a/b" || got.Permissions != "-rw-r--r--" {
		t.Errorf("fileInfo = %+v, want owner 1000 (no name), group users, path /a/b", got)
	}
}

func TestMetadataHeaders(t *testing.T) {
	tests := []struct {
		name    string
		h       http.Header
		want    map[string]string
		wantErr bool
	}{
		{"none", http.Header{"Content-Type": {"x"}}, nil, false},
		{"keys lower case", http.Header{"X-Space-Metadata-Foo.bar": {"1"}, "X-Space-Metadata-K_2-x": {""}},
			map[string]string{"foo.bar": "1", "k_2-x": ""}, false},
		{"two values", http.Header{"X-Space-Metadata-K": {"1", "2"}}, nil, true},
		{"bad key", http.Header{"X-Space-Metadata-K+1": {"1"}}, nil, true},
		{"empty key", http.Header{"X-Space-Metadata-": {"1"}}, nil, true},
		{"long value", http.Header{"X-Space-Metadata-K": {string(make([]byte, proto.MaxXattrValue+1))}}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := metadataHeaders(tt.h)
			if (err != nil) != tt.wantErr || !cmp.Equal(got, tt.want) {
				t.Errorf("metadataHeaders(%v) = %v, %v; want %v, error %v", tt.h, got, err, tt.want, tt.wantErr)
			}
		})
	}
	many := http.Header{}
	for i := range proto.MaxXattrs + 1 {
		many.Set(api.MetadataHeader+string(rune('a'+i%26))+string(rune('a'+i/26)), "v")
	}
	if _, err := metadataHeaders(many); err == nil {
		t.Errorf("metadataHeaders(%d headers) = nil error, want too many", len(many))
	}
}

func TestFileEventNames(t *testing.T) {
	tests := []struct {
		root, path, want string
	}{
		{"/w", "/w/a/b", "a/b"},
		{"/w", "/w", "."},
		{"/", "/etc", "etc"},
	}
	for _, tt := range tests {
		ev := fileEvent(tt.root, proto.WatchEvent{Op: proto.WatchCreate, Path: tt.path})
		if ev.Name != tt.want || ev.Path != tt.path || ev.Type != api.FileEventCreate {
			t.Errorf("fileEvent(%s, %s) = %+v, want name %q", tt.root, tt.path, ev, tt.want)
		}
	}
	if ev := fileEvent("/w", proto.WatchEvent{Op: proto.WatchOverflow}); ev != (api.FileEvent{Type: api.FileEventOverflow}) {
		t.Errorf("fileEvent(overflow) = %+v, want only the type", ev)
	}
}
