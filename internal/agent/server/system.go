package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

var errNoSystem = fmt.Errorf("agent has no system access: %w", errkind.FailedPrecondition)

func (s *Server) health() proto.Health {
	h := proto.Health{
		AgentVersion: s.cfg.Version,
		Protocol:     proto.Version,
		UptimeMS:     time.Since(s.start).Milliseconds(),
	}
	h.BootID = s.bootID()
	h.Hostname, _ = unixHostname()
	h.Usage = readUsage()
	return h
}

// kernelBootID is the file the kernel shows its boot_id in.
const kernelBootID = "/proc/sys/kernel/random/boot_id"

// bootID is the boot_id the guest's processes read now: after a
// post-restore that gave one, that one, not the kernel's. "" if unknown.
func (s *Server) bootID() string {
	if id, ok := s.cfg.System.(Identifier); ok {
		b, _ := id.BootID()
		return b
	}
	b, _ := os.ReadFile(kernelBootID)
	return string(trimNL(b))
}

func unixHostname() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Nodename[:]), nil
}

// postRestore fixes what a restored or forked guest shares with its origin:
// the clock, the RNG state and, when given, its name, machine and boot IDs
// and network identity. Nothing changes unless every argument is valid.
func (s *Server) postRestore(ctx context.Context, a proto.PostRestore) error {
	if s.cfg.System == nil {
		return errNoSystem
	}
	if a.UnixNanos <= 0 {
		return fmt.Errorf("post_restore: no time given: %w", errkind.InvalidArgument)
	}
	if len(a.Entropy) < 32 || len(a.Entropy) > 4096 {
		return fmt.Errorf("post_restore: %d bytes of entropy, want 32..4096: %w", len(a.Entropy), errkind.InvalidArgument)
	}
	if a.Hostname != "" {
		if err := checkHostname(a.Hostname); err != nil {
			return err
		}
	}
	if a.Network != nil {
		if err := checkNetwork(*a.Network); err != nil {
			return err
		}
	}
	if a.MachineID != "" && !validMachineID(a.MachineID) {
		return fmt.Errorf("post_restore: machine id %.64q, want 32 lowercase hex digits, not all zero: %w", a.MachineID, errkind.InvalidArgument)
	}
	if a.BootID != "" && !validBootID(a.BootID) {
		return fmt.Errorf("post_restore: boot id %.64q, want a lowercase UUID: %w", a.BootID, errkind.InvalidArgument)
	}
	ident, canIdent := s.cfg.System.(Identifier)
	if (a.MachineID != "" || a.BootID != "") && !canIdent {
		return fmt.Errorf("post_restore: machine and boot id: %w", errNoSystem)
	}
	if err := s.cfg.System.SetClock(time.Unix(0, a.UnixNanos)); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	if err := s.cfg.System.AddEntropy(a.Entropy); err != nil {
		return fmt.Errorf("reseed rng: %w", err)
	}
	if a.Hostname != "" {
		if err := s.cfg.System.SetHostname(a.Hostname); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	if a.MachineID != "" {
		if err := ident.SetMachineID(a.MachineID); err != nil {
			return fmt.Errorf("set machine id: %w", err)
		}
	}
	if a.BootID != "" {
		if err := ident.SetBootID(a.BootID); err != nil {
			return fmt.Errorf("set boot id: %w", err)
		}
	}
	if a.Network != nil {
		if err := s.cfg.System.ConfigureNetwork(ctx, *a.Network); err != nil {
			return fmt.Errorf("configure network: %w", err)
		}
	}
	return nil
}

// validMachineID reports whether id is a machine-id as systemd writes
// it: 32 lowercase hex digits, not all zero.
func validMachineID(id string) bool {
	return len(id) == 32 && isLowerHex(id) && strings.Trim(id, "0") != ""
}

// validBootID reports whether id is a UUID as the kernel shows boot_id:
// 8-4-4-4-12 lowercase hex digits.
func validBootID(id string) bool {
	parts := strings.Split(id, "-")
	if len(id) != 36 || len(parts) != 5 {
		return false
	}
	for i, n := range []int{8, 4, 4, 4, 12} {
		if len(parts[i]) != n || !isLowerHex(parts[i]) {
			return false
		}
	}
	return true
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *Server) network(ctx context.Context, cfg proto.NetConfig) error {
	if s.cfg.System == nil {
		return errNoSystem
	}
	if err := checkNetwork(cfg); err != nil {
		return err
	}
	return s.cfg.System.ConfigureNetwork(ctx, cfg)
}

func checkHostname(h string) error {
	if len(h) > 64 {
		return fmt.Errorf("hostname of %d bytes: %w", len(h), errkind.InvalidArgument)
	}
	for i, c := range h {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' && i > 0 || c == '.' && i > 0
		if !ok {
			return fmt.Errorf("hostname %.64q: %w", h, errkind.InvalidArgument)
		}
	}
	return nil
}

// checkNetwork validates a network config fully before anything changes.
func checkNetwork(cfg proto.NetConfig) error {
	if len(cfg.Interfaces) > 16 || len(cfg.Nameservers) > 8 {
		return fmt.Errorf("network: too many interfaces or nameservers: %w", errkind.InvalidArgument)
	}
	for _, ifc := range cfg.Interfaces {
		if _, err := net.ParseMAC(ifc.MAC); err != nil {
			return fmt.Errorf("network: mac %.32q: %w", ifc.MAC, errkind.InvalidArgument)
		}
		for _, a := range ifc.Addresses {
			if _, _, err := net.ParseCIDR(a); err != nil {
				return fmt.Errorf("network: address %.64q: %w", a, errkind.InvalidArgument)
			}
		}
		if ifc.Gateway != "" && net.ParseIP(ifc.Gateway) == nil {
			return fmt.Errorf("network: gateway %.64q: %w", ifc.Gateway, errkind.InvalidArgument)
		}
		if ifc.MTU != 0 && (ifc.MTU < 576 || ifc.MTU > 65535) {
			return fmt.Errorf("network: mtu %d: %w", ifc.MTU, errkind.InvalidArgument)
		}
	}
	for _, ns := range cfg.Nameservers {
		if net.ParseIP(ns) == nil {
			return fmt.Errorf("network: nameserver %.64q: %w", ns, errkind.InvalidArgument)
		}
	}
	return nil
}

// shutdown replies, then powers off once the reply is on its way.
func (s *Server) shutdown(c *call, a proto.Shutdown) error {
	if s.cfg.System == nil {
		return c.fail(errNoSystem)
	}
	if err := c.result(proto.Empty{}); err != nil {
		return err
	}
	c.st.Close()
	s.flush() // the reply must leave before the power goes
	s.log.Info("powering off on host request", "reboot", a.Reboot)
	return s.cfg.System.PowerOff(a.Reboot)
}
