package templatebuild

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"space/api"
	"space/internal/egress"
	"space/internal/errkind"
	"space/internal/image/rootfs"
	"space/internal/templatespec"
)

// Sandboxes starts build sandboxes.
type Sandboxes interface {
	// Boot starts a sandbox from base image with resources res, and a
	// network that reaches only what allow names (egress rules).
	Boot(ctx context.Context, image string, res templatespec.Resources, allow []string) (Sandbox, error)
	// Restore starts a sandbox from snapshot id (a cached step), with
	// the network allow names.
	Restore(ctx context.Context, snapshotID string, allow []string) (Sandbox, error)
}

// Sandbox is a running build sandbox.
type Sandbox interface {
	// Exec runs req to its end, copying its output.
	Exec(ctx context.Context, req api.Exec, stdout, stderr io.Writer) (api.Exit, error)
	// Start starts req and leaves it running.
	Start(ctx context.Context, req api.Exec) error
	// WriteFile writes r to the absolute path, creating parents.
	WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error
	// RemoveFile removes the file at the absolute path.
	RemoveFile(ctx context.Context, path string) error
	// PortOpen reports whether the guest accepts TCP connections on port
	// of its loopback.
	PortOpen(ctx context.Context, port int) (bool, error)
	// Snapshot captures the sandbox, named name, into the chunk store and
	// returns the snapshot's ID; the sandbox keeps running.
	Snapshot(ctx context.Context, name string) (string, error)
	// Delete removes the sandbox.
	Delete(ctx context.Context) error
}

// Cache is a team's build cache: cache key to snapshot.
type Cache interface {
	// Get returns the snapshot of key, or "" when there is none usable.
	Get(ctx context.Context, key string) (string, error)
	// Put records the snapshot of key.
	Put(ctx context.Context, key, snapshotID string) error
}

// Request is one build.
type Request struct {
	Spec       *templatespec.Spec // checked
	ContextDir string             // the build context the spec's paths are in
	// Name names the template (snapshot names carry it).
	Name string
	// Team is the team the build is for: a base from the build context
	// is its own image (see Images.Prepare). Required for such a base.
	Team string
	// Defaults fill the spec's zero resources.
	Defaults  templatespec.Resources
	Images    *Images
	Sandboxes Sandboxes
	Cache     Cache
	// Progress receives the build's events (types "step", "cached",
	// "output", "phase"); it must not block for long. Nil = none.
	Progress func(api.BuildEvent)
	Log      *slog.Logger
}

// Result is a template captured warm.
type Result struct {
	Key        string // the whole build's cache key
	SnapshotID string
	Image      Image
	Resources  templatespec.Resources
	Env        map[string]string
	Workdir    string
	User       string
	Start      []string // argv, or nil
	Report     api.BuildReport
}

// StepError is a run step that exited non-zero (or was killed).
type StepError struct {
	Step int // 1-based
	Exit api.Exit
	// Tail is the end of the step's output.
	Tail string
}

func (e *StepError) Error() string {
	what := fmt.Sprintf("exit code %d", e.Exit.Code)
	switch {
	case e.Exit.TimedOut:
		what = "timed out"
	case e.Exit.Signal != 0:
		what = fmt.Sprintf("killed by signal %d", e.Exit.Signal)
	}
	return fmt.Sprintf("step %d failed: %s", e.Step, what)
}

func (e *StepError) Unwrap() error { return errkind.FailedPrecondition }

// state is what steps set for the ones after them and for the template's
// sandboxes.
type state struct {
	env     map[string]string
	workdir string
	user    string
}

func initialState(cfg rootfs.ImageConfig) state {
	st := state{env: map[string]string{}, workdir: cfg.WorkingDir}
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			st.env[k] = v
		}
	}
	// user[:group]: the group is the user's own.
	st.user, _, _ = strings.Cut(cfg.User, ":")
	return st
}

func (st *state) apply(step templatespec.Step) {
	maps.Copy(st.env, step.Env)
	if step.Workdir != "" {
		st.workdir = st.resolve(step.Workdir)
	}
	if step.User != "" {
		st.user, _, _ = strings.Cut(step.User, ":")
	}
}

// resolve makes p absolute against the working directory.
func (st *state) resolve(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join("/", st.workdir, p)
}

func (st *state) exec(cmd templatespec.Command) api.Exec {
	return api.Exec{Command: cmd.Argv, Shell: cmd.Shell, Env: maps.Clone(st.env), Cwd: st.workdir, User: st.user}
}

// changesFiles says whether a step changes the file system (and so is
// worth a snapshot of its own): a workdir step makes its directory.
func changesFiles(s templatespec.Step) bool { return s.Run != nil || s.Copy != nil || s.Workdir != "" }

// keyed binds a cache key to what a snapshot's reuse also depends on: the
// sandbox's shape.
func keyed(key string, res templatespec.Resources, more ...any) string {
	h := sha256.New()
	b, _ := json.Marshal(append([]any{key, res}, more...))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// Build runs the build req describes and returns the template captured
// warm. Steps whose results are cached are not run; when the whole build
// is cached no sandbox starts. On error the build sandbox is gone; a
// failed run step is a *StepError.
func Build(ctx context.Context, req Request) (res Result, err error) {
	t0 := time.Now()
	log := req.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	emit := func(ev api.BuildEvent) {
		if req.Progress != nil {
			req.Progress(ev)
		}
	}
	spec := req.Spec
	if _, err := egress.ParseRules(spec.Network.Allow); err != nil {
		return res, fmt.Errorf("network.allow: %w", err)
	}
	res.Resources = withDefaults(spec.Resources, req.Defaults)
	res.Report.Steps = len(spec.Steps)
	defer func() { res.Report.DurationMS = time.Since(t0).Milliseconds() }()

	keys, err := templatespec.CacheKeys(spec, req.ContextDir)
	if err != nil {
		return res, err
	}
	emit(api.BuildEvent{Type: "phase", Text: "base image " + describeBase(spec.Base)})
	if res.Image, err = req.Images.Prepare(ctx, spec.Base, req.ContextDir, keys.Base, req.Team); err != nil {
		return res, err
	}
	st := initialState(res.Image.Config)
	stepKeys := make([]string, len(spec.Steps))
	states := make([]state, len(spec.Steps))
	for i, step := range spec.Steps {
		stepKeys[i] = keyed(keys.Steps[i], res.Resources)
		st.apply(step)
		states[i] = state{env: maps.Clone(st.env), workdir: st.workdir, user: st.user}
	}
	res.Env, res.Workdir, res.User = st.env, st.workdir, st.user
	res.Start = startArgv(spec.Start, res.Image.Config)
	res.Key = keyed(keys.Base, res.Resources, stepKeys, res.Start, spec.Ready)

	// The whole build cached: nothing runs.
	if snap, err := req.Cache.Get(ctx, res.Key); err != nil {
		return res, err
	} else if snap != "" {
		res.SnapshotID = snap
		res.Report.Cached = len(spec.Steps)
		for i := range spec.Steps {
			emit(api.BuildEvent{Type: "cached", Step: i + 1, Steps: len(spec.Steps), Text: describeStep(spec.Steps[i])})
		}
		return res, nil
	}

	// The longest cached prefix of steps.
	from, snap := 0, ""
	for i := len(spec.Steps) - 1; i >= 0 && snap == ""; i-- {
		if snap, err = req.Cache.Get(ctx, stepKeys[i]); err != nil {
			return res, err
		}
		if snap != "" {
			from = i + 1
		}
	}
	for i := range from {
		emit(api.BuildEvent{Type: "cached", Step: i + 1, Steps: len(spec.Steps), Text: describeStep(spec.Steps[i])})
	}
	res.Report.Cached = from

	var sb Sandbox
	if snap != "" {
		emit(api.BuildEvent{Type: "phase", Text: "build sandbox from the cache of step " + fmt.Sprint(from)})
		sb, err = req.Sandboxes.Restore(ctx, snap, spec.Network.Allow)
		res.Report.VMStarted = "restore"
	} else {
		emit(api.BuildEvent{Type: "phase", Text: "build sandbox from the base image"})
		sb, err = req.Sandboxes.Boot(ctx, res.Image.Name, res.Resources, spec.Network.Allow)
		res.Report.VMStarted = "boot"
	}
	if err != nil {
		return res, fmt.Errorf("build sandbox: %w", err)
	}
	defer func() {
		if derr := sb.Delete(context.WithoutCancel(ctx)); derr != nil {
			log.Warn("remove build sandbox", "err", derr)
		}
	}()

	dirty := false // the file system changed since the last cached snapshot
	for i := from; i < len(spec.Steps); i++ {
		step := spec.Steps[i]
		emit(api.BuildEvent{Type: "step", Step: i + 1, Steps: len(spec.Steps), Text: describeStep(step)})
		// A step runs with what the steps before it set.
		prev := initialState(res.Image.Config)
		if i > 0 {
			prev = states[i-1]
		}
		if err := runStep(ctx, sb, i+1, step, prev, states[i], req.ContextDir, emit); err != nil {
			var se *StepError
			if errors.As(err, &se) {
				res.Report.FailedStep, res.Report.ExitCode = se.Step, &se.Exit.Code
			}
			return res, err
		}
		res.Report.Executed++
		dirty = dirty || changesFiles(step)
		if dirty && (i == len(spec.Steps)-1 || changesFiles(spec.Steps[i+1])) {
			// Cache the file system before the next step changes it.
			id, err := sb.Snapshot(ctx, snapshotName("build", req.Name, stepKeys[i]))
			if err != nil {
				return res, fmt.Errorf("step %d: cache: %w", i+1, err)
			}
			res.Report.Snapshots++
			dirty = false
			for j := i; j >= from && (j == i || !changesFiles(spec.Steps[j+1])); j-- {
				if err := req.Cache.Put(ctx, stepKeys[j], id); err != nil {
					return res, fmt.Errorf("step %d: cache: %w", j+1, err)
				}
			}
		}
	}

	final := st
	if res.Start != nil {
		emit(api.BuildEvent{Type: "phase", Text: "start command " + strings.Join(res.Start, " ")})
		if err := sb.Start(ctx, api.Exec{Command: res.Start, Env: maps.Clone(final.env), Cwd: final.workdir, User: final.user}); err != nil {
			return res, fmt.Errorf("start command: %w", err)
		}
	}
	if spec.Ready != nil {
		emit(api.BuildEvent{Type: "phase", Text: "waiting until ready"})
		if err := waitReady(ctx, sb, spec.Ready, spec.ReadyTimeout(), final); err != nil {
			return res, err
		}
	}
	emit(api.BuildEvent{Type: "phase", Text: "capturing the template"})
	if res.SnapshotID, err = sb.Snapshot(ctx, snapshotName("template", req.Name, res.Key)); err != nil {
		return res, fmt.Errorf("capture: %w", err)
	}
	res.Report.Snapshots++
	if err := req.Cache.Put(ctx, res.Key, res.SnapshotID); err != nil {
		return res, err
	}
	return res, nil
}

// snapshotName names a build's snapshot: its kind, the template, the
// start of its key and a random part (two builds of one spec at once, or
// a snapshot that outlived its cache entry, never clash).
func snapshotName(kind, name, key string) string {
	return fmt.Sprintf("%s.%s.%s.%s", kind, name, key[:12], rand.Text()[:6])
}

func withDefaults(r, def templatespec.Resources) templatespec.Resources {
	if r.VCPUs == 0 {
		r.VCPUs = def.VCPUs
	}
	if r.MemoryMiB == 0 {
		r.MemoryMiB = def.MemoryMiB
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = def.DiskMiB
	}
	return r
}

// startArgv is the command the template keeps running: the spec's, else
// the OCI image's entrypoint and command.
func startArgv(c *templatespec.Command, cfg rootfs.ImageConfig) []string {
	switch {
	case c != nil && c.Shell != "":
		return []string{"/bin/sh", "-c", c.Shell}
	case c != nil:
		return c.Argv
	}
	argv := append(append([]string(nil), cfg.Entrypoint...), cfg.Cmd...)
	if len(argv) == 0 {
		return nil
	}
	return argv
}

// runStep runs one step in sb: prev is the state before it, after the
// state it leaves.
func runStep(ctx context.Context, sb Sandbox, n int, step templatespec.Step, prev, after state, contextDir string, emit func(api.BuildEvent)) error {
	switch {
	case step.Run != nil:
		tail := &tailWriter{max: 4 << 10}
		out := func(stream string) io.Writer {
			return io.MultiWriter(tail, writerFunc(func(p []byte) {
				emit(api.BuildEvent{Type: "output", Step: n, Stream: stream, Data: append([]byte(nil), p...)})
			}))
		}
		exit, err := sb.Exec(ctx, prev.exec(*step.Run), out("stdout"), out("stderr"))
		if err != nil {
			return fmt.Errorf("step %d: %w", n, err)
		}
		if exit.Code != 0 || exit.Signal != 0 || exit.TimedOut {
			return &StepError{Step: n, Exit: exit, Tail: tail.String()}
		}
	case step.Copy != nil:
		if err := copyIn(ctx, sb, filepath.Join(contextDir, step.Copy.Src), prev.resolve(step.Copy.Dst), strings.HasSuffix(step.Copy.Dst, "/")); err != nil {
			return fmt.Errorf("step %d: copy %s: %w", n, step.Copy.Src, err)
		}
	case step.Workdir != "":
		// Like a Dockerfile's WORKDIR, the directory is made if missing.
		marker := path.Join(after.workdir, ".space-workdir")
		if err := sb.WriteFile(ctx, marker, strings.NewReader(""), 0o644); err != nil {
			return fmt.Errorf("step %d: workdir %s: %w", n, after.workdir, err)
		}
		if err := sb.RemoveFile(ctx, marker); err != nil {
			return fmt.Errorf("step %d: workdir %s: %w", n, after.workdir, err)
		}
	}
	return nil
}

// copyIn copies the file or tree src of the build context to dst in the
// sandbox. A file copied to a dst that ends in "/" keeps its name.
func copyIn(ctx context.Context, sb Sandbox, src, dst string, intoDir bool) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		if intoDir {
			dst = path.Join(dst, filepath.Base(src))
		}
		return copyFile(ctx, sb, src, dst, fi)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return copyFile(ctx, sb, p, path.Join(dst, filepath.ToSlash(rel)), fi)
	})
}

func copyFile(ctx context.Context, sb Sandbox, src, dst string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: only regular files and directories can be copied: %w", src, errkind.InvalidArgument)
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return sb.WriteFile(ctx, dst, f, fi.Mode().Perm())
}

// waitReady polls the readiness check until it passes or timeout ends.
func waitReady(ctx context.Context, sb Sandbox, r *templatespec.Ready, timeout time.Duration, st state) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := probe(ctx, sb, r, st)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			what := fmt.Sprintf("tcp port %d", r.TCP)
			if r.Command != nil {
				what = "the ready command"
			}
			msg := fmt.Sprintf("not ready after %s: %s never passed", timeout, what)
			if last != nil {
				msg += fmt.Sprintf(" (last error: %v)", last)
			}
			return fmt.Errorf("%s: %w", msg, errkind.DeadlineExceeded)
		case <-tick.C:
		}
	}
}

func probe(ctx context.Context, sb Sandbox, r *templatespec.Ready, st state) (bool, error) {
	if r.Command != nil {
		exit, err := sb.Exec(ctx, st.exec(*r.Command), io.Discard, io.Discard)
		return err == nil && exit.Code == 0 && exit.Signal == 0, err
	}
	return sb.PortOpen(ctx, r.TCP)
}

func describeBase(b templatespec.Base) string {
	switch {
	case b.Debian != nil:
		return fmt.Sprintf("debian %s %s", b.Debian.Suite, strings.Join(b.Debian.Packages, " "))
	case b.Dir != "":
		return "dir " + b.Dir
	}
	return "oci " + b.OCI
}

func describeStep(s templatespec.Step) string {
	cmd := func(c templatespec.Command) string {
		if c.Shell != "" {
			return c.Shell
		}
		return strings.Join(c.Argv, " ")
	}
	switch {
	case s.Run != nil:
		return "run " + cmd(*s.Run)
	case s.Copy != nil:
		return "copy " + s.Copy.Src + " " + s.Copy.Dst
	case s.Env != nil:
		keys := make([]string, 0, len(s.Env))
		for k := range s.Env {
			keys = append(keys, k)
		}
		return "env " + strings.Join(keys, " ")
	case s.Workdir != "":
		return "workdir " + s.Workdir
	}
	return "user " + s.User
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// tailWriter keeps the last max bytes written.
type tailWriter struct {
	max int
	b   []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return string(t.b) }
