package migrate

import (
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		files   fstest.MapFS
		want    []int64
		wantErr bool
	}{
		{
			name: "ordered",
			files: fstest.MapFS{
				"m/0002_b.sql":  {Data: []byte("b")},
				"m/0001_a.sql":  {Data: []byte("a")},
				"m/README.md":   {Data: []byte("ignored")},
				"m/0010_x.sql~": {Data: []byte("ignored")},
			},
			want: []int64{1, 2},
		},
		{name: "empty", files: fstest.MapFS{"m/README.md": {}}, want: nil},
		{name: "gap", files: fstest.MapFS{"m/0001_a.sql": {}, "m/0003_c.sql": {}}, wantErr: true},
		{name: "repeat", files: fstest.MapFS{"m/0001_a.sql": {}, "m/01_b.sql": {}}, wantErr: true},
		{name: "bad name", files: fstest.MapFS{"m/init.sql": {}}, wantErr: true},
		{name: "zero", files: fstest.MapFS{"m/0000_a.sql": {}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := Load(tt.files, "m")
			if (err != nil) != tt.wantErr {
				t.Fatalf("Load() error = %v, wantErr %v", err, tt.wantErr)
			}
			var got []int64
			for _, m := range ms {
				got = append(got, m.Version)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Load() versions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPending(t *testing.T) {
	ms := []Migration{{Version: 1}, {Version: 2}, {Version: 3}}
	for applied, want := range map[int64]int{0: 3, 1: 2, 3: 0} {
		got, err := Pending(ms, applied)
		if err != nil || len(got) != want {
			t.Errorf("Pending(3 migrations, %d) = %d, %v; want %d, nil", applied, len(got), err, want)
		}
	}
	if _, err := Pending(ms, 4); err == nil {
		t.Errorf("Pending(3 migrations, 4) = nil error, want error")
	}
}
