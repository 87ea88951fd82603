// Package templatespec reads template specs: the small YAML file that says
// what a template is built from (an OCI image, a Debian base with
// packages, or a directory), the steps run inside a build sandbox, the
// command the template keeps running, how to tell it is ready, and the
// resources sandboxes get by default. docs/templates.md documents the
// format with examples; this package parses and checks it, and derives
// the cache keys that let a rebuild reuse the results of unchanged steps.
package templatespec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"space/internal/errkind"
)

// Spec is a template spec.
type Spec struct {
	// Name names the template; `space template build --name` overrides it.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// Base is what the first layer is made from.
	Base Base `yaml:"base" json:"base"`
	// Steps run in order inside a build sandbox.
	Steps []Step `yaml:"steps,omitempty" json:"steps,omitempty"`
	// Start keeps running in the template: sandboxes start with it
	// running. nil = nothing (or, for an OCI base, the image's
	// Entrypoint and Cmd).
	Start *Command `yaml:"start,omitempty" json:"start,omitempty"`
	// Ready tells when the started command is ready, so the template is
	// captured then; nil = at once.
	Ready *Ready `yaml:"ready,omitempty" json:"ready,omitempty"`
	// Resources are the defaults of the template's sandboxes.
	Resources Resources `yaml:"resources,omitempty" json:"resources,omitempty"`
	// Network is what the build sandbox may reach; nothing by default.
	Network Network `yaml:"network,omitempty" json:"network,omitempty"`
}

// Base is exactly one of OCI, Debian or Dir.
type Base struct {
	// OCI is an image: a registry reference, or a path in the build
	// context to an OCI layout directory, an OCI tarball or a
	// docker-archive tarball.
	OCI string `yaml:"oci,omitempty" json:"oci,omitempty"`
	// Debian is a Debian base bootstrapped on the host.
	Debian *Debian `yaml:"debian,omitempty" json:"debian,omitempty"`
	// Dir is a directory of the build context used as the root.
	Dir string `yaml:"dir,omitempty" json:"dir,omitempty"`
}

// Debian is a Debian base: a suite and packages installed when it is
// bootstrapped.
type Debian struct {
	Suite    string   `yaml:"suite" json:"suite"`
	Packages []string `yaml:"packages,omitempty" json:"packages,omitempty"`
}

// Step is exactly one of its fields.
type Step struct {
	// Run runs a command; it must exit 0.
	Run *Command `yaml:"run,omitempty" json:"run,omitempty"`
	// Copy copies a file or directory of the build context in.
	Copy *Copy `yaml:"copy,omitempty" json:"copy,omitempty"`
	// Env sets variables for the following steps, the start command and
	// the template's sandboxes.
	Env map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	// Workdir is the working directory of what follows.
	Workdir string `yaml:"workdir,omitempty" json:"workdir,omitempty"`
	// User runs what follows as this user: a name, or uid[:gid].
	User string `yaml:"user,omitempty" json:"user,omitempty"`
}

// Copy copies Src (relative to the build context) to Dst (absolute, in
// the sandbox).
type Copy struct {
	Src string `yaml:"src" json:"src"`
	Dst string `yaml:"dst" json:"dst"`
}

// Command is a shell command line or an argv. In YAML a string is a shell
// command (run by /bin/sh -c), a list an argv.
type Command struct {
	Shell string   `json:"shell,omitempty"`
	Argv  []string `json:"argv,omitempty"`
}

// Ready is how the build knows the start command is ready: a command
// that exits 0, or a TCP port that accepts connections, polled until
// Timeout.
type Ready struct {
	Command *Command `yaml:"command,omitempty" json:"command,omitempty"`
	TCP     int      `yaml:"tcp,omitempty" json:"tcp,omitempty"`
	Timeout Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
}

// Resources are sandbox defaults; zero values take the server's.
type Resources struct {
	VCPUs     int   `yaml:"vcpus,omitempty" json:"vcpus,omitempty"`
	MemoryMiB int64 `yaml:"memory_mib,omitempty" json:"memory_mib,omitempty"`
	DiskMiB   int64 `yaml:"disk_mib,omitempty" json:"disk_mib,omitempty"`
}

// Network is the build sandbox's egress: host names (exact, or "*.suffix"
// for any name under suffix). Empty: no network.
type Network struct {
	Allow []string `yaml:"allow,omitempty" json:"allow,omitempty"`
}

// Duration is a time.Duration written as "90s", "2m".
type Duration time.Duration

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (like 30s or 2m)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration string (JSON, for cache keys and
// reports).
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalYAML reads a string as a shell command and a list as an argv.
func (c *Command) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Decode(&c.Shell)
	case yaml.SequenceNode:
		return n.Decode(&c.Argv)
	}
	return fmt.Errorf("line %d: a command is a string (run by /bin/sh -c) or a list (an argv)", n.Line)
}

// MaxSize bounds a spec file.
const MaxSize = 1 << 20

// Error is a spec that does not parse or does not check: Field is the path
// of the offending value ("steps[2].copy.src"), "" for the whole file.
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return "template spec: " + e.Msg
	}
	return "template spec: " + e.Field + ": " + e.Msg
}

// Unwrap makes errors.Is(err, errkind.InvalidArgument) hold.
func (e *Error) Unwrap() error { return errkind.InvalidArgument }

func invalid(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Parse reads and checks a spec. Unknown fields, a second YAML document
// or a file over MaxSize are errors.
func Parse(r io.Reader) (*Spec, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("template spec: %w", err)
	}
	if len(b) > MaxSize {
		return nil, invalid("", "larger than %d bytes", MaxSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, invalid("", "empty")
		}
		return nil, invalid("", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, invalid("", "more than one YAML document")
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &s, nil
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	suiteRE   = regexp.MustCompile(`^[a-z]{2,20}$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{1,99}$`)
	userRE    = regexp.MustCompile(`^([a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)
	hostRE    = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// Limits of a spec's values.
const (
	MaxSteps        = 200
	MaxReadyTimeout = 10 * time.Minute
	DefaultReady    = time.Minute
)

// Check checks the spec's values; Parse calls it.
func (s *Spec) Check() error {
	if s.Name != "" && !nameRE.MatchString(s.Name) {
		return invalid("name", "%.70q: 1-63 characters of [a-z0-9-], starting with a letter or digit", s.Name)
	}
	if err := s.Base.check(); err != nil {
		return err
	}
	if len(s.Steps) > MaxSteps {
		return invalid("steps", "%d steps, at most %d", len(s.Steps), MaxSteps)
	}
	for i, st := range s.Steps {
		if err := st.check(fmt.Sprintf("steps[%d]", i)); err != nil {
			return err
		}
	}
	if s.Start != nil {
		if err := s.Start.check("start"); err != nil {
			return err
		}
	}
	if r := s.Ready; r != nil {
		switch {
		case r.Command != nil && r.TCP != 0:
			return invalid("ready", "give a command or a tcp port, not both")
		case r.Command == nil && r.TCP == 0:
			return invalid("ready", "give a command or a tcp port")
		case r.TCP < 0 || r.TCP > 65535:
			return invalid("ready.tcp", "%d is not a port", r.TCP)
		case r.Timeout < 0 || time.Duration(r.Timeout) > MaxReadyTimeout:
			return invalid("ready.timeout", "%v is outside 0..%v", time.Duration(r.Timeout), MaxReadyTimeout)
		case s.Start == nil && s.Base.OCI == "":
			return invalid("ready", "nothing is started: give start")
		}
		if r.Command != nil {
			if err := r.Command.check("ready.command"); err != nil {
				return err
			}
		}
	}
	res := s.Resources
	switch {
	case res.VCPUs < 0 || res.VCPUs > 64:
		return invalid("resources.vcpus", "%d is outside 1..64", res.VCPUs)
	case res.MemoryMiB != 0 && (res.MemoryMiB < 128 || res.MemoryMiB > 256<<10):
		return invalid("resources.memory_mib", "%d is outside 128..%d", res.MemoryMiB, 256<<10)
	case res.DiskMiB != 0 && (res.DiskMiB < 512 || res.DiskMiB > 1<<20):
		return invalid("resources.disk_mib", "%d is outside 512..%d", res.DiskMiB, 1<<20)
	}
	for i, h := range s.Network.Allow {
		if len(h) > 253 || !hostRE.MatchString(h) {
			return invalid(fmt.Sprintf("network.allow[%d]", i), "%.70q is not a lower-case host name or *.suffix", h)
		}
	}
	return nil
}

func (b Base) check() error {
	n := 0
	for _, set := range []bool{b.OCI != "", b.Debian != nil, b.Dir != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return invalid("base", "give exactly one of oci, debian or dir")
	}
	switch {
	case b.Debian != nil:
		if !suiteRE.MatchString(b.Debian.Suite) {
			return invalid("base.debian.suite", "%.40q is not a suite name (bookworm, trixie, ...)", b.Debian.Suite)
		}
		for i, p := range b.Debian.Packages {
			if !packageRE.MatchString(p) {
				return invalid(fmt.Sprintf("base.debian.packages[%d]", i), "%.70q is not a Debian package name", p)
			}
		}
	case b.Dir != "":
		if err := contextPath("base.dir", b.Dir); err != nil {
			return err
		}
	case LocalOCI(b.OCI):
		if err := contextPath("base.oci", b.OCI); err != nil {
			return err
		}
	default:
		if strings.ContainsAny(b.OCI, " \t\n\x00") || len(b.OCI) > 512 {
			return invalid("base.oci", "%.70q is not an image reference", b.OCI)
		}
	}
	return nil
}

// LocalPath returns the path in the build context the base is made
// from (a directory, or an OCI layout or tarball), or "" for a base
// from elsewhere (a registry, the Debian archive).
func (b Base) LocalPath() string {
	switch {
	case b.Dir != "":
		return b.Dir
	case b.OCI != "" && LocalOCI(b.OCI):
		return b.OCI
	}
	return ""
}

// LocalOCI reports whether an oci base names a path in the build context
// (it starts with ./ or ../ or /, or ends in .tar) rather than a registry
// reference.
func LocalOCI(ref string) bool {
	return strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "../") || strings.HasPrefix(ref, "/") || strings.HasSuffix(ref, ".tar")
}

// contextPath checks a path relative to the build context that must not
// leave it.
func contextPath(field, p string) error {
	clean := path.Clean(p)
	if p == "" || path.IsAbs(p) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsRune(p, 0) {
		return invalid(field, "%.70q must be a path inside the build context (relative, without ..)", p)
	}
	return nil
}

func (st Step) check(field string) error {
	n := 0
	for _, set := range []bool{st.Run != nil, st.Copy != nil, st.Env != nil, st.Workdir != "", st.User != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return invalid(field, "a step is exactly one of run, copy, env, workdir or user")
	}
	switch {
	case st.Run != nil:
		return st.Run.check(field + ".run")
	case st.Copy != nil:
		if err := contextPath(field+".copy.src", st.Copy.Src); err != nil {
			return err
		}
		if !path.IsAbs(st.Copy.Dst) || strings.ContainsRune(st.Copy.Dst, 0) {
			return invalid(field+".copy.dst", "%.70q must be an absolute path", st.Copy.Dst)
		}
	case st.Env != nil:
		if len(st.Env) == 0 {
			return invalid(field+".env", "no variables")
		}
		for k, v := range st.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				return invalid(field+".env", "variable %.64q: names are non-empty without '=' and values have no NUL", k)
			}
		}
	case st.Workdir != "":
		if !path.IsAbs(st.Workdir) || strings.ContainsRune(st.Workdir, 0) {
			return invalid(field+".workdir", "%.70q must be an absolute path", st.Workdir)
		}
	case st.User != "":
		if !userRE.MatchString(st.User) {
			return invalid(field+".user", "%.40q is not a user name or uid[:gid]", st.User)
		}
	}
	return nil
}

func (c Command) check(field string) error {
	switch {
	case c.Shell == "" && len(c.Argv) == 0:
		return invalid(field, "empty command")
	case strings.ContainsRune(c.Shell, 0):
		return invalid(field, "NUL in the command")
	}
	for i, a := range c.Argv {
		if strings.ContainsRune(a, 0) {
			return invalid(field+"["+strconv.Itoa(i)+"]", "NUL in the argument")
		}
	}
	if len(c.Argv) > 0 && c.Argv[0] == "" {
		return invalid(field+"[0]", "empty program")
	}
	return nil
}

// ReadyTimeout is how long the build waits for readiness.
func (s *Spec) ReadyTimeout() time.Duration {
	if s.Ready == nil || s.Ready.Timeout == 0 {
		return DefaultReady
	}
	return time.Duration(s.Ready.Timeout)
}
