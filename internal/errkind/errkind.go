// Package errkind defines the small set of error kinds every SPACE layer uses.
//
// Errors wrap a kind so callers can test for the kind with errors.Is without
// matching on text:
//
//	var ErrNotRunning = fmt.Errorf("sandbox not running: %w", errkind.FailedPrecondition)
//
// Only the API and agent boundaries map kinds to wire codes.
package errkind

import "errors"

// Kind is one class of failure. Its String form is wire format.
type Kind struct{ name string }

func (k *Kind) Error() string  { return k.name }
func (k *Kind) String() string { return k.name }

// The kinds. Wrap them with %w; never compare error text.
var (
	NotFound           = &Kind{"not_found"}
	Conflict           = &Kind{"conflict"}
	InvalidArgument    = &Kind{"invalid_argument"}
	FailedPrecondition = &Kind{"failed_precondition"}
	Unavailable        = &Kind{"unavailable"}
	ResourceExhausted  = &Kind{"resource_exhausted"}
	PermissionDenied   = &Kind{"permission_denied"}
	DeadlineExceeded   = &Kind{"deadline_exceeded"}
	Internal           = &Kind{"internal"}
)

var all = []*Kind{NotFound, Conflict, InvalidArgument, FailedPrecondition, Unavailable,
	ResourceExhausted, PermissionDenied, DeadlineExceeded, Internal}

// Of returns the kind err wraps, or Internal when it wraps none.
func Of(err error) *Kind {
	for _, k := range all {
		if errors.Is(err, k) {
			return k
		}
	}
	return Internal
}

// Parse returns the kind whose String is name, or Internal for unknown names.
func Parse(name string) *Kind {
	for _, k := range all {
		if k.name == name {
			return k
		}
	}
	return Internal
}
