package controlplane

import (
	"encoding/json"
	"fmt"

	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/store"
)

// The store keeps a record's typed parts as opaque JSON: each is decoded
// here, in one function, and a blob that does not decode is an Internal
// error naming the record (the caller reports it; nothing guesses).

// specOf decodes sb's Spec.
func specOf(sb store.Sandbox) (spec, error) {
	var sp spec
	if err := json.Unmarshal(sb.Spec, &sp); err != nil {
		return spec{}, fmt.Errorf("sandbox %s: stored spec: %v: %w", sb.ID, err, errkind.Internal)
	}
	return sp, nil
}

// handleOf decodes sb's Handle; a record without one has the zero value.
func handleOf(sb store.Sandbox) (stored, error) {
	var st stored
	if len(sb.Handle) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(sb.Handle, &st); err != nil {
		return stored{}, fmt.Errorf("sandbox %s: stored handle: %v: %w", sb.ID, err, errkind.Internal)
	}
	return st, nil
}

// suspendedFrom returns the snapshot sb is suspended to (from the moment
// a suspend took it until a resume completes), or "".
func suspendedFrom(sb store.Sandbox) (string, error) {
	st, err := handleOf(sb)
	return st.Suspended, err
}

// metaOf decodes sn's Meta; a snapshot still being created may have none
// (the zero value).
func metaOf(sn store.Snapshot) (snapshotMeta, error) {
	var m snapshotMeta
	if len(sn.Meta) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(sn.Meta, &m); err != nil {
		return snapshotMeta{}, fmt.Errorf("snapshot %s: stored metadata: %v: %w", sn.ID, err, errkind.Internal)
	}
	return m, nil
}

// templateMetaOf decodes t's Meta; a version still building has none (the
// zero value).
func templateMetaOf(t store.Template) (templateMeta, error) {
	var m templateMeta
	if len(t.Meta) == 0 {
		return m, nil
	}
	if err := json.Unmarshal(t.Meta, &m); err != nil {
		return templateMeta{}, fmt.Errorf("template %s of team %s: stored metadata: %v: %w", templateRef(t.Name, t.Version), t.TeamID, err, errkind.Internal)
	}
	return m, nil
}

// loaded is a record as the control plane sees it. A suspend made before
// sandboxes had a suspended state left them stopped with the snapshot in
// the handle: such a record is suspended. (A handle that does not decode
// leaves the record as it is; whatever reads the handle reports it.)
func loaded(sb store.Sandbox) store.Sandbox {
	if sb.State == sandbox.Stopped {
		if snap, err := suspendedFrom(sb); err == nil && snap != "" {
			sb.State = sandbox.Suspended
		}
	}
	return sb
}
