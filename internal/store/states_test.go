package store

import (
	"errors"
	"testing"

	"space/internal/errkind"
)

func TestCheckSnapshot(t *testing.T) {
	tests := []struct {
		from, to SnapshotState
		want     error
	}{
		{SnapshotCreating, SnapshotReady, nil},
		{SnapshotCreating, SnapshotDeleting, nil},
		{SnapshotReady, SnapshotDeleting, nil},
		{SnapshotReady, SnapshotCreating, ErrSnapshotTransition},
		{SnapshotDeleting, SnapshotReady, ErrSnapshotTransition},
		{SnapshotReady, SnapshotReady, ErrSnapshotTransition},
		{"bogus", SnapshotReady, errkind.InvalidArgument},
		{SnapshotCreating, "bogus", errkind.InvalidArgument},
	}
	for _, tt := range tests {
		err := CheckSnapshot(tt.from, tt.to)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("CheckSnapshot(%s, %s) = %v, want %v", tt.from, tt.to, err, tt.want)
		}
	}
	for _, s := range SnapshotStates {
		if _, ok := snapshotTransitions[s]; !ok {
			t.Errorf("snapshot state %s listed but not in the table", s)
		}
	}
}

func TestCheckTemplate(t *testing.T) {
	tests := []struct {
		from, to TemplateState
		want     error
	}{
		{TemplateBuilding, TemplateReady, nil},
		{TemplateBuilding, TemplateFailed, nil},
		{TemplateBuilding, TemplateDeleting, nil},
		{TemplateReady, TemplateDeleting, nil},
		{TemplateFailed, TemplateDeleting, nil},
		{TemplateReady, TemplateFailed, ErrTemplateTransition},
		{TemplateFailed, TemplateReady, ErrTemplateTransition},
		{TemplateDeleting, TemplateBuilding, ErrTemplateTransition},
		{"bogus", TemplateReady, errkind.InvalidArgument},
		{TemplateBuilding, "bogus", errkind.InvalidArgument},
	}
	for _, tt := range tests {
		err := CheckTemplate(tt.from, tt.to)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("CheckTemplate(%s, %s) = %v, want %v", tt.from, tt.to, err, tt.want)
		}
	}
	for _, s := range TemplateStates {
		if _, ok := templateTransitions[s]; !ok {
			t.Errorf("template state %s listed but not in the table", s)
		}
	}
}
