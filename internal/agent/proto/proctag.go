package proto

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"space/internal/errkind"
)

// MaxProcTag bounds ProcStart.Tag, in bytes.
const MaxProcTag = 256

// CheckProcTag reports why tag cannot name a process, or nil: it must be
// UTF-8 of at most MaxProcTag bytes without control characters. The empty
// tag is no tag.
func CheckProcTag(tag string) error {
	switch {
	case len(tag) > MaxProcTag:
		return fmt.Errorf("process tag of %d bytes: at most %d: %w", len(tag), MaxProcTag, errkind.InvalidArgument)
	case !utf8.ValidString(tag):
		return fmt.Errorf("process tag %.64q: not UTF-8: %w", tag, errkind.InvalidArgument)
	}
	for _, r := range tag {
		if unicode.IsControl(r) {
			return fmt.Errorf("process tag %.64q: control character %U: %w", tag, r, errkind.InvalidArgument)
		}
	}
	return nil
}
