package fcapitest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RunProcess makes the calling process stand in for a firecracker
// process: it parses a firecracker command line, binds the API socket
// (failing, as Firecracker does, if the path exists) and serves a
// FakeFirecracker on it until the process is killed or cfg.Exit ends it.
// It writes complaints to stderr and returns an exit status only on
// failure. SIGTERM keeps its default action, as in Firecracker, which
// installs no handler for it. Flags: --api-sock, --id, --level and the
// jailer's --start-time-us, --start-time-cpu-us, --parent-cpu-time-us;
// --version prints the version and returns 0; anything else is an error.
func RunProcess(args []string, cfg Config, stdout, stderr io.Writer) int {
	sock := "/run/firecracker.socket"
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(args[i], "=")
		switch name {
		case "--version":
			v := cfg.Version
			if v == "" {
				v = "1.16.1"
			}
			fmt.Fprintf(stdout, "Firecracker v%s\n", v)
			return 0
		case "--api-sock", "--id", "--level", "--start-time-us", "--start-time-cpu-us", "--parent-cpu-time-us":
		default:
			fmt.Fprintf(stderr, "Arguments parsing error: Found argument '%s' which wasn't expected, or isn't valid in this context.\n", args[i])
			return 1
		}
		if !hasValue {
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "Arguments parsing error: The argument '%s' requires a value, but none was supplied\n", name)
				return 1
			}
			i++
			value = args[i]
		}
		switch name {
		case "--api-sock":
			sock = value
		case "--id":
			cfg.ID = value
		}
	}
	if cfg.Console == nil {
		cfg.Console = stdout
	}
	f, err := New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintf(stderr, "Failed to open the API socket at: %s. Check that it is not already used. %v\n", sock, err)
		return 1
	}
	err = http.Serve(ln, f)
	fmt.Fprintf(stderr, "API server stopped: %v\n", err)
	return 1
}

// Serve serves a new FakeFirecracker on a unix socket until t ends and
// returns it with the socket's path (in a short temporary directory, so
// that it fits sun_path).
func Serve(t testing.TB, cfg Config) (*FakeFirecracker, string) {
	t.Helper()
	f, err := New(cfg)
	if err != nil {
		t.Fatalf("setup: fake firecracker: %v", err)
	}
	dir, err := os.MkdirTemp("", "fakefc")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("setup: %v", err)
	}
	srv := &http.Server{Handler: f}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		f.Close()
		os.RemoveAll(dir)
	})
	return f, sock
}
