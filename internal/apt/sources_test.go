package apt

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"space/internal/errkind"
)

const bookwormRelease = `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION_CODENAME=bookworm
ID=debian
`

const hostDeb822 = `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.example.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

// writeTree writes files (path relative to the root → content) under a new
// temporary root and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return root
}

func TestMirrorIn(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{
			name: "deb822 skips security",
			files: map[string]string{
				"etc/os-release": bookwormRelease,
				"etc/apt/sources.list.d/a-security.sources": "Types: deb\nURIs: http://sec.example.org/debian-security/\nSuites: bookworm-security\nComponents: main\n",
				"etc/apt/sources.list.d/debian.sources":     hostDeb822,
			},
			want: "http://deb.example.org/debian",
		},
		{
			name: "one-line sources.list comes first",
			files: map[string]string{
				"etc/os-release":                        bookwormRelease,
				"etc/apt/sources.list":                  "# comment\ndeb-src http://src.example.org/debian bookworm main\ndeb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://one.example.org/debian/ bookworm main contrib # trailing\n",
				"etc/apt/sources.list.d/debian.sources": hostDeb822,
			},
			want: "http://one.example.org/debian",
		},
		{
			name: "third-party repositories are skipped",
			files: map[string]string{
				"etc/os-release":                        bookwormRelease,
				"etc/apt/sources.list.d/cloud.list":     "deb https://cloud.example.com/apt cloud-sdk-bookworm main\n",
				"etc/apt/sources.list.d/docker.list":    "deb [arch=amd64] https://download.example.com/linux/debian bookworm stable\n",
				"etc/apt/sources.list.d/node.sources":   "Types: deb\nURIs: https://node.example.com/node_20.x\nSuites: nodistro\nComponents: main\n",
				"etc/apt/sources.list.d/zz-deb.sources": hostDeb822,
			},
			want: "http://deb.example.org/debian",
		},
		{
			name: "official-looking source wins over a lookalike listed first",
			files: map[string]string{
				"etc/os-release":                        bookwormRelease,
				"etc/apt/sources.list.d/aaa-php.list":   "deb https://php.example.com/php/ bookworm main\n",
				"etc/apt/sources.list.d/debian.sources": hostDeb822,
			},
			want: "http://deb.example.org/debian",
		},
		{
			name: "lookalike is used when nothing better exists",
			files: map[string]string{
				"etc/os-release":       bookwormRelease,
				"etc/apt/sources.list": "deb http://mirror.example.net/pub/linux bookworm-updates main\n",
			},
			want: "http://mirror.example.net/pub/linux",
		},
		{
			name: "disabled and deb-src paragraphs are skipped",
			files: map[string]string{
				"etc/os-release": bookwormRelease,
				"etc/apt/sources.list.d/debian.sources": "Types: deb\nURIs: http://off.example.org/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n" +
					"Types: deb-src\nURIs: http://src.example.org/debian\nSuites: bookworm\nComponents: main\n\n" +
					"types: deb deb-src\nuris: http://on.example.org/debian\nsuites: bookworm\ncomponents: main\nsigned-by:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n -----END PGP PUBLIC KEY BLOCK-----\n",
			},
			want: "http://on.example.org/debian",
		},
		{
			name: "suite names without os-release codename",
			files: map[string]string{
				"etc/apt/sources.list": "deb http://deb.example.org/debian unstable main\n",
			},
			want: "http://deb.example.org/debian",
		},
		{
			name: "usr lib os-release fallback",
			files: map[string]string{
				"usr/lib/os-release":   "VERSION_CODENAME=trixie\n",
				"etc/apt/sources.list": "deb http://deb.example.org/debian bookworm main\ndeb http://new.example.org/debian trixie main\n",
			},
			want: "http://new.example.org/debian",
		},
		{
			name: "unsupported schemes are skipped",
			files: map[string]string{
				"etc/os-release":       bookwormRelease,
				"etc/apt/sources.list": "deb cdrom:[Debian 12]/ bookworm main\ndeb mirror+file:/etc/apt/mirrors.txt bookworm main\ndeb https://deb.example.org/debian bookworm main\n",
			},
			want: "https://deb.example.org/debian",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := writeTree(t, tt.files)
			got, err := MirrorIn(root)
			if err != nil {
				t.Fatalf("MirrorIn() error = %v", err)
			}
			if got != tt.want {
				t.Errorf("MirrorIn() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMirrorInNotFound(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
	}{
		{name: "no sources", files: map[string]string{"etc/os-release": bookwormRelease}},
		{
			name: "only security and third party",
			files: map[string]string{
				"etc/os-release":                                bookwormRelease,
				"etc/apt/sources.list":                          "deb http://sec.example.org/debian-security bookworm-security main\n",
				"etc/apt/sources.list.d/other.list":             "deb http://other.example.org/ubuntu jammy main\n",
				"etc/apt/sources.list.d/other.sources.disabled": hostDeb822,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := writeTree(t, tt.files)
			got, err := MirrorIn(root)
			if !errors.Is(err, errkind.NotFound) {
				t.Errorf("MirrorIn() = %q, %v, want an error wrapping %v", got, err, errkind.NotFound)
			}
		})
	}
}

func TestCodenameIn(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		want    string
		wantErr error
	}{
		{name: "etc", files: map[string]string{"etc/os-release": bookwormRelease}, want: "bookworm"},
		{name: "quoted", files: map[string]string{"etc/os-release": "ID=debian\nVERSION_CODENAME=\"trixie\"\n"}, want: "trixie"},
		{
			name:  "etc wins over usr lib",
			files: map[string]string{"etc/os-release": bookwormRelease, "usr/lib/os-release": "VERSION_CODENAME=trixie\n"},
			want:  "bookworm",
		},
		{name: "missing key", files: map[string]string{"etc/os-release": "ID=debian\n"}, wantErr: errkind.NotFound},
		{name: "no file", files: map[string]string{}, wantErr: errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := writeTree(t, tt.files)
			got, err := CodenameIn(root)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("CodenameIn() = %q, %v, want an error wrapping %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("CodenameIn() = %q, %v, want %q", got, err, tt.want)
			}
		})
	}
}
