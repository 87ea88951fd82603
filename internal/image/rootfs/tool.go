package rootfs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"space/internal/errkind"
)

// sbinDirs hold administration tools that are often missing from a non-root
// user's PATH.
var sbinDirs = []string{"/usr/sbin", "/sbin"}

// lookTool finds a host command, looking in dirs when it is not on PATH. The
// error names the apt package to install and wraps [errkind.FailedPrecondition].
func lookTool(name, aptPackage string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (install the apt package %s): %w", name, aptPackage, errkind.FailedPrecondition)
}

// run runs a command and returns its combined output's tail. A failed run
// returns an error that includes that tail. ctx ending kills the whole
// process group.
func run(ctx context.Context, name string, args ...string) (string, error) {
	return runEnv(ctx, nil, name, args...)
}

// runEnv is run with env (KEY=value) added to the process's environment.
func runEnv(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	text := strings.TrimSpace(out.String())
	if err != nil {
		if ctx.Err() != nil {
			return text, fmt.Errorf("%s: %w", filepath.Base(name), context.Cause(ctx))
		}
		if text == "" {
			return text, fmt.Errorf("%s: %w", filepath.Base(name), err)
		}
		return text, fmt.Errorf("%s: %s: %w", filepath.Base(name), text, err)
	}
	return text, nil
}

// tail keeps the last tailSize bytes written to it.
type tail struct{ b []byte }

const tailSize = 4096

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*tailSize {
		t.b = append(t.b[:0], t.b[len(t.b)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	if len(t.b) > tailSize {
		return "..." + string(t.b[len(t.b)-tailSize:])
	}
	return string(t.b)
}
