// Package apt drives the host's apt tools and reads Debian packages, with clear errors.
package apt

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"space/internal/errkind"
)

// Mirror returns the host's Debian main-archive URI (such as the one
// debootstrap needs), read from apt's sources. See [MirrorIn].
func Mirror() (string, error) { return MirrorIn("/") }

// Codename returns the host's release codename (VERSION_CODENAME in
// /etc/os-release, such as "bookworm"). See [CodenameIn].
func Codename() (string, error) { return CodenameIn("/") }

// MirrorIn is [Mirror] for the system whose root directory is root. It reads
// root/etc/apt/sources.list (one-line format), then root/etc/apt/sources.list.d
// (*.list one-line and *.sources deb822 files, in name order), as apt does,
// and returns the first enabled "deb" source that looks like the Debian main
// archive: component main, and a suite that is the host's codename (or a Debian
// suite name such as stable or unstable), optionally with -updates,
// -backports or -proposed-updates. Security suites and third-party
// repositories are skipped. Sources signed by the Debian archive keyring or
// whose URI ends in /debian win over other matches. The URI comes back
// without a trailing slash. An error wrapping [errkind.NotFound] means no
// source qualifies.
func MirrorIn(root string) (string, error) {
	codename, err := CodenameIn(root)
	if err != nil && !errors.Is(err, errkind.NotFound) {
		return "", err
	}
	srcs, err := readSources(root)
	if err != nil {
		return "", err
	}
	best, bestRank := "", 2
	for _, s := range srcs {
		if !s.isDebianArchive(codename) {
			continue
		}
		for _, u := range s.uris {
			if !supportedURI(u) {
				continue
			}
			if r := s.rank(u); r < bestRank {
				best, bestRank = strings.TrimRight(u, "/"), r
			}
		}
	}
	if best == "" {
		return "", fmt.Errorf("no debian archive among the apt sources in %s: %w",
			filepath.Join(root, "etc/apt"), errkind.NotFound)
	}
	return best, nil
}

// CodenameIn is [Codename] for the system whose root directory is root. It
// reads root/etc/os-release, falling back to root/usr/lib/os-release. An error
// wrapping [errkind.NotFound] means neither file names a codename.
func CodenameIn(root string) (string, error) {
	var data []byte
	var name string
	for _, p := range []string{"etc/os-release", "usr/lib/os-release"} {
		name = filepath.Join(root, p)
		b, err := os.ReadFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read release codename: %w", err)
		}
		data = b
		break
	}
	if data == nil {
		return "", fmt.Errorf("no os-release file in %s: %w", root, errkind.NotFound)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || k != "VERSION_CODENAME" {
			continue
		}
		v = strings.Trim(strings.TrimSpace(v), `"'`)
		if v == "" {
			break
		}
		return v, nil
	}
	return "", fmt.Errorf("%s: no VERSION_CODENAME: %w", name, errkind.NotFound)
}

// source is one apt source entry: a one-line "deb" line or a deb822 paragraph.
type source struct {
	file       string
	types      []string
	uris       []string
	suites     []string
	components []string
	signedBy   string
	enabled    bool
}

// debianSuites are Debian's suite names other than release codenames.
var debianSuites = []string{"stable", "oldstable", "oldoldstable", "testing", "unstable", "sid", "experimental"}

func (s source) isDebianArchive(codename string) bool {
	if !s.enabled || !slices.Contains(s.types, "deb") || !slices.Contains(s.components, "main") {
		return false
	}
	for _, suite := range s.suites {
		base := suite
		for _, suffix := range []string{"-updates", "-backports", "-proposed-updates"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if (codename != "" && base == codename) || slices.Contains(debianSuites, base) {
			return true
		}
	}
	return false
}

// rank orders matching sources: 0 for ones that also look official (Debian
// archive keyring, or the archive's usual /debian path), 1 for the rest.
func (s source) rank(uri string) int {
	if strings.Contains(s.signedBy, "debian-archive-keyring") || strings.HasSuffix(strings.TrimRight(uri, "/"), "/debian") {
		return 0
	}
	return 1
}

func supportedURI(u string) bool {
	for _, scheme := range []string{"http://", "https://", "file:/"} {
		if strings.HasPrefix(u, scheme) {
			return true
		}
	}
	return false
}

// readSources reads every source under root/etc/apt in apt's order.
func readSources(root string) ([]source, error) {
	dir := filepath.Join(root, "etc/apt")
	var srcs []source
	main := filepath.Join(dir, "sources.list")
	b, err := os.ReadFile(main)
	switch {
	case err == nil:
		srcs = append(srcs, parseOneLine(main, b)...)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read apt sources: %w", err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "sources.list.d"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read apt sources: %w", err)
	}
	for _, e := range entries { // ReadDir sorts by name, as apt does
		name := filepath.Join(dir, "sources.list.d", e.Name())
		isList, isDeb822 := strings.HasSuffix(e.Name(), ".list"), strings.HasSuffix(e.Name(), ".sources")
		if e.IsDir() || (!isList && !isDeb822) {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read apt sources: %w", err)
		}
		if isList {
			srcs = append(srcs, parseOneLine(name, b)...)
		} else {
			srcs = append(srcs, parseDeb822(name, b)...)
		}
	}
	return srcs, nil
}

// parseOneLine parses the one-line format:
//
//	deb [ option=value ... ] uri suite [component ...]
func parseOneLine(file string, b []byte) []source {
	var srcs []source
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		s := source{file: file, types: fields[:1], enabled: true}
		rest := fields[1:]
		if strings.HasPrefix(rest[0], "[") {
			opts := strings.Join(rest, " ")
			end := strings.Index(opts, "]")
			if end < 0 {
				continue // malformed; apt would reject the file
			}
			for _, o := range strings.Fields(opts[1:end]) {
				if k, v, ok := strings.Cut(o, "="); ok && k == "signed-by" {
					s.signedBy = v
				}
			}
			rest = strings.Fields(opts[end+1:])
		}
		if len(rest) < 2 {
			continue
		}
		s.uris, s.suites, s.components = rest[:1], rest[1:2], rest[2:]
		srcs = append(srcs, s)
	}
	return srcs
}

// parseDeb822 parses deb822 ".sources" paragraphs, separated by blank lines.
func parseDeb822(file string, b []byte) []source {
	var srcs []source
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 {
			srcs = append(srcs, source{
				file:       file,
				types:      strings.Fields(fields["types"]),
				uris:       strings.Fields(fields["uris"]),
				suites:     strings.Fields(fields["suites"]),
				components: strings.Fields(fields["components"]),
				signedBy:   fields["signed-by"],
				enabled:    !strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no"),
			})
		}
		fields, last = map[string]string{}, ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20) // Signed-By may embed a whole key
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return srcs
}
