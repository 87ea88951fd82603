package fcapitest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
)

// checkID applies the path id rules: valid characters, and equal to the
// id in the body.
func checkID(pathID string, bodyID *string, field string) error {
	if !idPattern.MatchString(pathID) {
		return fmt.Errorf("Invalid ID: %q. The ID must be alphanumeric (and can contain underscores).", pathID)
	}
	if err := missing(field, bodyID); err != nil {
		return err
	}
	if *bodyID != pathID {
		return errors.New("The id from the path does not match the id from the body!")
	}
	return nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putDriveLocked(id string, body []byte) result {
	var b driveBody
	if err := decode(body, "/drives", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.DriveID, "drive_id"); err != nil {
		return reject(err)
	}
	if err := missing("is_root_device", b.IsRootDevice); err != nil {
		return reject(err)
	}
	if b.Socket != nil {
		return rejectf("the fake does not implement vhost-user drives")
	}
	if err := missing("path_on_host", b.PathOnHost, "is_read_only", b.IsReadOnly); err != nil {
		return reject(err)
	}
	if err := b.RateLimiter.check(); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	if err := openDrive(*b.PathOnHost, *b.IsReadOnly); err != nil {
		return rejectf("Unable to create the block device: %v", err)
	}
	d := savedDrive{ID: id, Path: *b.PathOnHost, Root: *b.IsRootDevice, ReadOnly: *b.IsReadOnly}
	for i, old := range f.st.drives {
		if old.ID == id {
			f.st.drives[i] = d
			return done()
		}
		if old.Root && d.Root {
			return rejectf("A root block device already exists!")
		}
	}
	f.st.drives = append(f.st.drives, d)
	return done()
}

func openDrive(path string, readOnly bool) error {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	fl, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return err
	}
	return fl.Close()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) patchDriveLocked(id string, body []byte) result {
	var b drivePatchBody
	if err := decode(body, "/drives", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.DriveID, "drive_id"); err != nil {
		return reject(err)
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	for i, d := range f.st.drives {
		if d.ID != id {
			continue
		}
		if b.PathOnHost != nil {
			if err := openDrive(*b.PathOnHost, d.ReadOnly); err != nil {
				return rejectf("Unable to patch the block device: %v", err)
			}
			f.st.drives[i].Path = *b.PathOnHost
		}
		return done()
	}
	return rejectf("Invalid block device ID: %s.", id)
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putNICLocked(id string, body []byte) result {
	var b nicBody
	if err := decode(body, "/network-interfaces", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.IfaceID, "iface_id"); err != nil {
		return reject(err)
	}
	if err := missing("host_dev_name", b.HostDevName); err != nil {
		return reject(err)
	}
	if b.GuestMAC != nil && !macPattern.MatchString(*b.GuestMAC) {
		return rejectf("Invalid MAC address: %s.", *b.GuestMAC)
	}
	if b.MTU != nil && (*b.MTU < 68 || *b.MTU > 65535) {
		return rejectf("Invalid MTU: %d.", *b.MTU)
	}
	if err := errors.Join(b.RxRateLimiter.check(), b.TxRateLimiter.check()); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	n := savedNIC{ID: id, Tap: *b.HostDevName}
	if b.GuestMAC != nil {
		n.MAC = *b.GuestMAC
	}
	for i, old := range f.st.nics {
		if old.ID == id {
			f.st.nics[i] = n
			return done()
		}
		if old.Tap == n.Tap {
			return rejectf("The host device name %s is already in use.", n.Tap)
		}
	}
	f.st.nics = append(f.st.nics, n)
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putVsockLocked(body []byte) result {
	var b vsockBody
	if err := decode(body, "/vsock", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("guest_cid", b.GuestCID, "uds_path", b.UDSPath); err != nil {
		return reject(err)
	}
	if *b.GuestCID < 3 {
		return rejectf("Invalid guest CID: %d.", *b.GuestCID)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	if err := f.bindVsockLocked(*b.UDSPath); err != nil {
		return rejectf("Cannot create backend for vsock device: %v", err)
	}
	f.st.vsock = &savedVsock{CID: *b.GuestCID, Path: *b.UDSPath}
	return done()
}

// bindVsockLocked binds the vsock unix socket, replacing an earlier one.
// Connections are closed unanswered, as Firecracker does when no guest
// listens on the requested port.
// +checklocks:f.vmm
func (f *FakeFirecracker) bindVsockLocked(path string) error {
	if f.st.vsockLn != nil {
		f.st.vsockLn.Close()
		f.st.vsockLn = nil
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	f.st.vsockLn = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putEntropyLocked(body []byte) result {
	var b entropyBody
	if err := decode(body, "/entropy", f.version, &b); err != nil {
		return reject(err)
	}
	if err := b.RateLimiter.check(); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	f.st.entropy = true
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) balloonLocked(method string, body []byte) result {
	switch method {
	case http.MethodPut:
		var b balloonBody
		if err := decode(body, "/balloon", f.version, &b); err != nil {
			return reject(err)
		}
		if err := missing("amount_mib", b.AmountMiB, "deflate_on_oom", b.DeflateOnOOM); err != nil {
			return reject(err)
		}
		if err := f.bootSpecificLocked(); err != nil {
			return reject(err)
		}
		f.st.balloon = &b
		return done()
	case http.MethodPatch:
		var b balloonPatchBody
		if err := decode(body, "/balloon", f.version, &b); err != nil {
			return reject(err)
		}
		if err := missing("amount_mib", b.AmountMiB); err != nil {
			return reject(err)
		}
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		if f.st.balloon == nil {
			return rejectf("No balloon device found.")
		}
		f.st.balloon.AmountMiB = b.AmountMiB
		return done()
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	if f.st.balloon == nil || f.st.balloon.StatsPollingIntervalS == nil || *f.st.balloon.StatsPollingIntervalS == 0 {
		return rejectf("Statistics for the balloon device are not enabled")
	}
	target := int64(*f.st.balloon.AmountMiB)
	return answer(map[string]int64{"target_pages": target * 256, "actual_pages": target * 256, "target_mib": target, "actual_mib": target})
}

// +checklocks:f.vmm
func (f *FakeFirecracker) actionLocked(body []byte) result {
	var b actionBody
	if err := decode(body, "/actions", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("action_type", b.ActionType); err != nil {
		return reject(err)
	}
	switch *b.ActionType {
	case "InstanceStart":
		if f.st.phase != notStarted {
			return reject(errAfterStart)
		}
		if f.st.kernel == "" {
			return rejectf("Cannot start microvm without kernel configuration.")
		}
		f.st.phase = running
		if f.cfg.Serial != "" && f.cfg.Console != nil {
			io.WriteString(f.cfg.Console, f.cfg.Serial)
		}
		return done()
	case "FlushMetrics":
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		return done()
	case "SendCtrlAltDel":
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		r := done()
		if f.cfg.CtrlAltDelReboots && f.st.phase == running {
			r.exit = 0
		}
		return r
	}
	return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", *b.ActionType)
}

// +checklocks:f.vmm
func (f *FakeFirecracker) patchVMLocked(body []byte) result {
	var b vmBody
	if err := decode(body, "/vm", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("state", b.State); err != nil {
		return reject(err)
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	switch *b.State {
	case "Paused":
		f.st.phase = paused
	case "Resumed":
		f.st.phase = running
	default:
		return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", *b.State)
	}
	return done()
}
