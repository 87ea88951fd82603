package fcapitest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"
)

// +checklocks:f.vmm
func (f *FakeFirecracker) createSnapshotLocked(body []byte) result {
	var b snapshotCreateBody
	if err := decode(body, "/snapshot/create", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("snapshot_path", b.SnapshotPath, "mem_file_path", b.MemFilePath); err != nil {
		return reject(err)
	}
	kind := "Full"
	if b.SnapshotType != nil {
		kind = *b.SnapshotType
	}
	if kind != "Full" && kind != "Diff" {
		return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", kind)
	}
	switch f.st.phase {
	case notStarted:
		return reject(errBeforeStart)
	case running:
		return rejectf("Cannot create a snapshot while the microVM is running; pause it first.")
	}
	// Before 1.13 a diff needed KVM dirty tracking; since then mincore
	// stands in for it.
	if kind == "Diff" && !f.st.dirty && !f.version.AtLeast(1, 13) {
		return rejectf("Diff snapshots are not enabled for this microVM: enable dirty page tracking.")
	}
	st := vmstate{
		Magic: vmstateMagic, Version: f.cfg.Version, VCPUs: f.st.vcpus, MemMiB: f.st.memMiB,
		BootArgs: f.st.bootArgs, Drives: f.st.drives, NICs: f.st.nics, Vsock: f.st.vsock, Entropy: f.st.entropy,
	}
	data, err := json.Marshal(st)
	if err != nil {
		return reject(err)
	}
	if err := writeSynced(*b.SnapshotPath, data); err != nil {
		return rejectf("Cannot save the microVM state: %v", err)
	}
	if err := writeMemory(*b.MemFilePath, int64(f.st.memMiB)<<20, kind == "Diff"); err != nil {
		return rejectf("Cannot save the guest memory: %v", err)
	}
	return done()
}

func writeSynced(path string, data []byte) error {
	fl, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644) // Firecracker: 0666 less umask
	if err != nil {
		return err
	}
	_, err = fl.Write(data)
	if err == nil {
		err = fl.Sync()
	}
	if cerr := fl.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeMemory writes a stand-in memory file: sparse, size bytes long,
// with a marker at the start. A diff onto an existing file of the exact
// guest size merges into it instead of truncating it.
func writeMemory(path string, size int64, diff bool) error {
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if fi, err := os.Stat(path); diff && err == nil && fi.Size() == size {
		flag = os.O_WRONLY
	}
	fl, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return err
	}
	_, err = fl.WriteAt([]byte("fake guest memory"), 0)
	if err == nil {
		err = fl.Truncate(size)
	}
	if err == nil {
		err = fl.Sync()
	}
	if cerr := fl.Close(); err == nil {
		err = cerr
	}
	return err
}

// +checklocks:f.vmm
func (f *FakeFirecracker) loadSnapshotLocked(body []byte) result {
	var b snapshotLoadBody
	if err := decode(body, "/snapshot/load", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("snapshot_path", b.SnapshotPath); err != nil {
		return reject(err)
	}
	if (b.MemBackend == nil) == (b.MemFilePath == nil) {
		return rejectf("Either mem_backend or mem_file_path must be specified, but not both.")
	}
	if b.MemBackend != nil {
		if err := missing("backend_type", b.MemBackend.BackendType, "backend_path", b.MemBackend.BackendPath); err != nil {
			return reject(err)
		}
		if t := *b.MemBackend.BackendType; t != "File" && t != "Uffd" {
			return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", t)
		}
	}
	for _, o := range b.NetworkOverrides {
		if err := missing("iface_id", o.IfaceID, "host_dev_name", o.HostDevName); err != nil {
			return reject(err)
		}
	}
	if b.VsockOverride != nil {
		if err := missing("uds_path", b.VsockOverride.UDSPath); err != nil {
			return reject(err)
		}
	}
	if f.st.phase != notStarted {
		return reject(errAfterStart)
	}
	if f.st.bootPath {
		return rejectf("Loading a microVM snapshot not allowed after configuring boot-specific resources.")
	}
	// From here on a failure is fatal: Firecracker exits after answering.
	if err := f.restoreLocked(&b); err != nil {
		return fatal(fmt.Errorf("Load snapshot error: %v", err))
	}
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) restoreLocked(b *snapshotLoadBody) error {
	data, err := os.ReadFile(*b.SnapshotPath)
	if err != nil {
		return err
	}
	var st vmstate
	if err := json.Unmarshal(data, &st); err != nil || st.Magic != vmstateMagic {
		return fmt.Errorf("snapshot file %s is not a microVM state file", *b.SnapshotPath)
	}
	if st.Version != f.cfg.Version {
		return fmt.Errorf("snapshot version %s is not supported by Firecracker v%s", st.Version, f.cfg.Version)
	}
	size := int64(st.MemMiB) << 20
	switch {
	case b.MemFilePath != nil:
		err = checkMemory(*b.MemFilePath, size)
	case *b.MemBackend.BackendType == "File":
		err = checkMemory(*b.MemBackend.BackendPath, size)
	default:
		var c net.Conn
		c, err = net.DialTimeout("unix", *b.MemBackend.BackendPath, time.Second)
		if err == nil {
			c.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("guest memory: %w", err)
	}
	for _, d := range st.Drives {
		if err := openDrive(d.Path, d.ReadOnly); err != nil {
			return fmt.Errorf("block device %s: %w", d.ID, err)
		}
	}
	for _, o := range b.NetworkOverrides {
		found := false
		for i := range st.NICs {
			if st.NICs[i].ID == *o.IfaceID {
				st.NICs[i].Tap, found = *o.HostDevName, true
			}
		}
		if !found {
			return fmt.Errorf("network override for unknown interface %s", *o.IfaceID)
		}
	}
	if st.Vsock != nil {
		if b.VsockOverride != nil {
			st.Vsock.Path = *b.VsockOverride.UDSPath
		}
		if err := f.bindVsockLocked(st.Vsock.Path); err != nil {
			return fmt.Errorf("vsock: %w", err)
		}
	}
	f.st.vcpus, f.st.memMiB, f.st.bootArgs = st.VCPUs, st.MemMiB, st.BootArgs
	f.st.drives, f.st.nics, f.st.vsock, f.st.entropy = st.Drives, st.NICs, st.Vsock, st.Entropy
	f.st.dirty = (b.TrackDirtyPages != nil && *b.TrackDirtyPages) || (b.EnableDiffSnapshots != nil && *b.EnableDiffSnapshots)
	f.st.phase = paused
	if b.ResumeVM != nil && *b.ResumeVM {
		f.st.phase = running
	}
	return nil
}

func checkMemory(path string, size int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Size() != size {
		return fmt.Errorf("memory file %s has %d bytes, want %d", path, fi.Size(), size)
	}
	return nil
}
