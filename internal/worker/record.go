package worker

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"space/api"
	"space/internal/sandbox"
	"space/internal/vmm"
)

// recordFile is the name of a sandbox's record in its directory.
const recordFile = "record.json"

// record is what the worker persists about a sandbox: enough to find and
// re-adopt (or remove) everything it created for it.
type record struct {
	ID      string        `json:"id"`
	Team    string        `json:"team"`
	Spec    Spec          `json:"spec"`
	State   sandbox.State `json:"state"`
	Created time.Time     `json:"created"`
	// Cgroup is the sandbox's control group, or "" when cgroups are off.
	Cgroup string `json:"cgroup,omitempty"`
	// Handle is the VMM handle, set as soon as the VMM runs.
	Handle *vmm.Handle `json:"handle,omitempty"`
	VM     *api.VMInfo `json:"vm,omitempty"`
	// RestoreFrom names the snapshot a create or an in-place restore
	// starts the VM from, until the VM runs; "" for a boot.
	RestoreFrom string `json:"restore_from,omitempty"`
	// Internal marks a sandbox the worker made for itself (to capture a
	// warm template, or kept ready in a pool); a restart removes it.
	Internal bool `json:"internal,omitempty"`
	// Pool is the shape key of a pool member (internal, restored and
	// ready to be handed to a create of that shape).
	Pool string `json:"pool,omitempty"`
	// Slot names the sandbox's directories and control group when it
	// was made under another ID: a pool member handed to a create keeps
	// its own. "" = ID.
	Slot string `json:"slot,omitempty"`
	// Net are the sandbox's link addresses when it has network.
	Net *netAddrs `json:"net,omitempty"`
	// Secrets are the granted secrets' values, sealed with the worker's
	// key (see Config.Secrets), by name.
	Secrets map[string][]byte `json:"secrets,omitempty"`
}

// slot is the name of the sandbox's directories.
func (r record) slot() string { return cmp.Or(r.Slot, r.ID) }

// writeRecord persists r in dir atomically and durably: a crash leaves the
// old record or the new one, never a mix.
func writeRecord(dir string, r record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".record-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, recordFile)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readRecord reads the record in dir.
func readRecord(dir string) (record, error) {
	var r record
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("record %s: %w", dir, err)
	}
	if r.slot() != filepath.Base(dir) || !r.State.Valid() {
		return r, fmt.Errorf("record %s: id %q (slot %q) or state %q does not fit", dir, r.ID, r.Slot, r.State)
	}
	return r, nil
}
