package store

import (
	"fmt"
	"slices"

	"space/internal/errkind"
)

// ErrSnapshotTransition is returned by CheckSnapshot for a change of state
// the snapshot table forbids.
var ErrSnapshotTransition = fmt.Errorf("invalid snapshot state transition: %w", errkind.FailedPrecondition)

// ErrTemplateTransition is returned by CheckTemplate for a change of state
// the template table forbids.
var ErrTemplateTransition = fmt.Errorf("invalid template state transition: %w", errkind.FailedPrecondition)

// snapshotTransitions is the table: from each snapshot state, the states
// that may follow. A snapshot is written once (creating → ready) and then
// only removed; a creating one that is never finished is rolled back.
var snapshotTransitions = map[SnapshotState][]SnapshotState{
	SnapshotCreating: {SnapshotReady, SnapshotDeleting},
	SnapshotReady:    {SnapshotDeleting},
	SnapshotDeleting: {},
}

// templateTransitions is the table for template versions: a build ends
// ready or failed (or is abandoned), and any version may then be removed.
var templateTransitions = map[TemplateState][]TemplateState{
	TemplateBuilding: {TemplateReady, TemplateFailed, TemplateDeleting},
	TemplateReady:    {TemplateDeleting},
	TemplateFailed:   {TemplateDeleting},
	TemplateDeleting: {},
}

// CheckSnapshot returns nil if a snapshot may go from one state to the
// other, else an error wrapping ErrSnapshotTransition (FailedPrecondition),
// or InvalidArgument for an unknown state.
func CheckSnapshot(from, to SnapshotState) error {
	return check("snapshot", snapshotTransitions, from, to, ErrSnapshotTransition)
}

// CheckTemplate returns nil if a template version may go from one state to
// the other, else an error wrapping ErrTemplateTransition
// (FailedPrecondition), or InvalidArgument for an unknown state.
func CheckTemplate(from, to TemplateState) error {
	return check("template", templateTransitions, from, to, ErrTemplateTransition)
}

func check[S ~string](what string, table map[S][]S, from, to S, forbidden error) error {
	next, ok := table[from]
	if !ok {
		return fmt.Errorf("unknown %s state %q: %w", what, from, errkind.InvalidArgument)
	}
	if slices.Contains(next, to) {
		return nil
	}
	if _, ok := table[to]; !ok {
		return fmt.Errorf("unknown %s state %q: %w", what, to, errkind.InvalidArgument)
	}
	return fmt.Errorf("%s -> %s: %w", from, to, forbidden)
}
