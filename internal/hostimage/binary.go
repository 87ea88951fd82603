package hostimage

import (
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"time"

	"space/internal/errkind"
)

// binaryInfo is what a Go binary records about its build.
type binaryInfo struct {
	version  string    // module version, or the short VCS revision of a checkout build ("+dirty" when modified)
	revision string    // full VCS revision, or ""
	time     time.Time // commit time, or zero
}

// checkStatic fails unless the file at path is a statically linked x86-64
// executable, which runs on any base. The error wraps
// [errkind.FailedPrecondition] and says how to build one.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: not an ELF executable (%v): %w", path, err, errkind.FailedPrecondition)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s: built for %v, want x86-64: %w", path, f.Machine, errkind.FailedPrecondition)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s: dynamically linked (build it with CGO_ENABLED=0): %w", path, errkind.FailedPrecondition)
		}
	}
	return nil
}

// readBinary returns the build information of the Go binary at path, as
// `space version` reports it.
func readBinary(path string) (binaryInfo, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return binaryInfo{}, fmt.Errorf("%s: no Go build information (%v): %w", path, err, errkind.FailedPrecondition)
	}
	info := binaryInfo{version: bi.Main.Version}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.revision = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				info.time = t
			}
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if info.revision != "" && (info.version == "" || info.version == "(devel)") {
		info.version = info.revision[:min(12, len(info.revision))]
		if dirty {
			info.version += "+dirty"
		}
	}
	if info.version == "" {
		info.version = "(devel)"
	}
	return info, nil
}
