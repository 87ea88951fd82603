package apt

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// Package is one version of a Debian package as the local apt index
// describes it.
type Package struct {
	Name     string // e.g. "linux-image-6.1.0-57-cloud-amd64"
	Version  string // Debian version, e.g. "6.1.192-3"
	Filename string // path of the .deb in the archive, e.g. "pool/main/..."
	Size     int64  // size of the .deb in bytes; 0 if the index does not say
	SHA256   string // lowercase hex digest of the .deb
	Depends  string // raw Depends field; "" if none

	// Path is the downloaded .deb. Download sets it; Lookup leaves it "".
	Path string
}

// ErrCorrupt is returned by Download when the downloaded file does not match
// the digest in the index. A retry (perhaps after apt-get update) may succeed.
var ErrCorrupt = fmt.Errorf("download corrupt: %w", errkind.Unavailable)

// Lookup returns the candidate version of pkg from the local apt index
// (apt-cache show). It does not touch the network. An unknown or purely
// virtual package yields an error wrapping [errkind.NotFound]; missing apt
// tools yield [errkind.FailedPrecondition].
func Lookup(ctx context.Context, pkg string) (Package, error) {
	if pkg == "" || strings.HasPrefix(pkg, "-") {
		return Package{}, fmt.Errorf("look up package %q: invalid name: %w", pkg, errkind.InvalidArgument)
	}
	out, stderr, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil && !bytes.Contains(stderr, []byte("No packages found")) {
		return Package{}, fmt.Errorf("look up package %s: %w", pkg, err)
	}
	p, ok := parseStanza(out, pkg)
	if !ok {
		return Package{}, fmt.Errorf("look up package %s: not in the apt index (run apt-get update?): %w", pkg, errkind.NotFound)
	}
	if p.Version == "" || p.Filename == "" || p.SHA256 == "" {
		return Package{}, fmt.Errorf("look up package %s: index entry lacks Version, Filename or SHA256: %w", pkg, errkind.FailedPrecondition)
	}
	return p, nil
}

// Download fetches the candidate version of pkg into dir with apt-get
// download, verifies its SHA256 against the index and returns it with Path
// set. A digest mismatch removes the file and returns [ErrCorrupt]; a full
// disk returns [errkind.ResourceExhausted]; see [Lookup] for the other kinds.
func Download(ctx context.Context, pkg, dir string) (Package, error) {
	p, err := Lookup(ctx, pkg)
	if err != nil {
		return Package{}, err
	}
	if err := checkSpace(dir, p.Size); err != nil {
		return Package{}, fmt.Errorf("download %s: %w", pkg, err)
	}
	file := filepath.Join(dir, path.Base(p.Filename))
	_, stderr, err := run(ctx, dir, "apt-get", "download", "--quiet", p.Name+"="+p.Version)
	if err != nil {
		os.Remove(file) // partial file, if any
		switch {
		case bytes.Contains(stderr, []byte("No space left on device")):
			return Package{}, fmt.Errorf("download %s: no space left in %s: %w", pkg, dir, errkind.ResourceExhausted)
		case bytes.Contains(stderr, []byte("Unable to locate package")),
			bytes.Contains(stderr, []byte("was not found")):
			return Package{}, fmt.Errorf("download %s=%s: not in the apt index (run apt-get update?): %w", pkg, p.Version, errkind.NotFound)
		}
		return Package{}, fmt.Errorf("download %s: %w", pkg, err)
	}
	sum, err := fileSHA256(file)
	if err != nil {
		return Package{}, fmt.Errorf("download %s: %w", pkg, err)
	}
	if sum != p.SHA256 {
		os.Remove(file)
		return Package{}, fmt.Errorf("download %s=%s: sha256 %s, index says %s: %w", pkg, p.Version, sum, p.SHA256, ErrCorrupt)
	}
	p.Path = file
	return p, nil
}

// Resolve returns the versioned package that metapackage metaPkg depends on,
// for example linux-image-6.1.0-57-cloud-amd64 for linux-image-cloud-amd64:
// the dependency whose name, with its numeric components removed, is metaPkg.
// A name that already has numeric components is returned as is.
func Resolve(ctx context.Context, metaPkg string) (string, error) {
	if stripNumeric(metaPkg) != metaPkg {
		return metaPkg, nil
	}
	p, err := Lookup(ctx, metaPkg)
	if err != nil {
		return "", err
	}
	for _, dep := range dependNames(p.Depends) {
		if dep != metaPkg && stripNumeric(dep) == metaPkg {
			return dep, nil
		}
	}
	return "", fmt.Errorf("resolve %s: no versioned package in Depends %q: %w", metaPkg, p.Depends, errkind.NotFound)
}

// stripNumeric drops the dash-separated components of name that start with
// a digit: "linux-image-6.1.0-57-cloud-amd64" becomes "linux-image-cloud-amd64".
func stripNumeric(name string) string {
	var keep []string
	for c := range strings.SplitSeq(name, "-") {
		if c == "" || c[0] < '0' || c[0] > '9' {
			keep = append(keep, c)
		}
	}
	return strings.Join(keep, "-")
}

// dependNames returns the package names in a Depends field, alternatives
// included, without version constraints or architecture qualifiers.
func dependNames(depends string) []string {
	var names []string
	for alt := range strings.FieldsFuncSeq(depends, func(r rune) bool { return r == ',' || r == '|' }) {
		name, _, _ := strings.Cut(strings.TrimSpace(alt), " ")
		name, _, _ = strings.Cut(name, "(")
		name, _, _ = strings.Cut(name, ":")
		if name != "" {
			names = append(names, name)
		}
	}
	return names
}

// parseStanza returns the first stanza of apt-cache output that describes
// package name.
func parseStanza(out []byte, name string) (Package, bool) {
	for stanza := range strings.SplitSeq(string(out), "\n\n") {
		fields := map[string]string{}
		var last string
		for line := range strings.SplitSeq(stanza, "\n") {
			if line == "" {
				continue
			}
			if line[0] == ' ' || line[0] == '\t' { // continuation line
				if last != "" {
					fields[last] += "\n" + line
				}
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = k
			fields[k] = strings.TrimSpace(v)
		}
		if fields["Package"] != name {
			continue
		}
		size, _ := strconv.ParseInt(fields["Size"], 10, 64)
		return Package{
			Name:     name,
			Version:  fields["Version"],
			Filename: fields["Filename"],
			Size:     size,
			SHA256:   strings.ToLower(fields["SHA256"]),
			Depends:  strings.Join(strings.Fields(fields["Depends"]), " "),
		}, true
	}
	return Package{}, false
}

// run runs an apt tool in dir with messages in English (so that the few
// that are classified can be recognised) and returns its stdout and stderr.
func run(ctx context.Context, dir, tool string, args ...string) (stdout, stderr []byte, err error) {
	bin, err := exec.LookPath(tool)
	if err != nil {
		return nil, nil, fmt.Errorf("%s not found (install apt package \"apt\"): %w", tool, errkind.FailedPrecondition)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, errb.Bytes(), context.Cause(ctx)
		}
		return nil, errb.Bytes(), fmt.Errorf("%s %s: %s: %w", tool, strings.Join(args, " "), lastLines(errb.Bytes(), 3), err)
	}
	return out.Bytes(), errb.Bytes(), nil
}

// lastLines returns the last n non-empty lines of b joined by "; ".
func lastLines(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "no output"
	}
	return strings.Join(lines, "; ")
}

// checkSpace fails early with [errkind.ResourceExhausted] when dir's
// filesystem has fewer than need bytes available.
func checkSpace(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if avail := int64(st.Bavail) * st.Bsize; avail < need {
		return fmt.Errorf("no space left in %s: need %d bytes, %d available: %w", dir, need, avail, errkind.ResourceExhausted)
	}
	return nil
}

func fileSHA256(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("apt-get download left no %s: %w", filepath.Base(name), errkind.Internal)
		}
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
