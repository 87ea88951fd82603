// Package qemu boots and stops guest VMs under QEMU (q35, TCG or KVM).
//
// A [Driver] starts one QEMU process per [VM]. Everything a VM needs on the
// host lives in its private run directory (Spec.Dir, mode 0700):
//
//	memory       guest RAM (memory-backend-file, share=on), sparse; removed by Stop
//	qmp.sock     QMP monitor; the VM holds one connection ([VM.QMP])
//	serial.sock  the guest console; the VM copies it into serial.log
//	agent.sock   the virtio-serial port named [AgentPort]; the caller connects
//	serial.log   console output, capped at Spec.SerialLogLimit; kept
//	qemu.log     QEMU's stderr, capped; kept
//
// The driver binds the three sockets itself and passes the listening
// descriptors to QEMU, so they exist (mode 0600) before QEMU starts and a
// client can connect as soon as Boot returns. RAM is file-backed and shared
// so that a later snapshot can save device state with x-ignore-shared and
// clones can map the same file copy-on-write. QEMU has no network device.
//
// Lifecycle: Boot starts QEMU with its vCPUs stopped, connects QMP and the
// console, then resumes the vCPUs unless Spec.Paused; it does not wait for
// the guest. QEMU runs in its own process group without a parent-death
// signal, so it outlives a restart of the calling process. Stop asks QEMU to
// quit, kills it after Config.StopGrace, reaps it and removes the memory
// file and sockets. The caller must call Stop, even after QEMU has exited
// on its own.
//
// # Confinement
//
// When the caller is root, QEMU runs as an unprivileged user
// (Config.User, by default [DefaultUID] and [DefaultGID]) and in a jail of its own
// (package jail): new network, mount, PID, IPC and UTS namespaces, a
// root that holds only read-only binds of /usr (binary, libraries,
// firmware and option ROMs), the loader cache and a few device nodes
// (/dev/kvm only for KVM guests), an empty capability bounding set and
// no_new_privs, on top of QEMU's own seccomp filter (-sandbox) and the
// cgroup Spec.Placer gives it. QEMU needs no path of the host: its
// sockets, kernel, initrd, disks and memory file are inherited
// descriptors (files are named /proc/self/fd/N, reopened through the
// jail's own proc), its NIC is a tap descriptor opened in the tap's
// namespace or a unix socket it inherits listening, and migration
// streams come over QMP (getfd). So from inside QEMU neither the
// host's loopback (where the control plane listens) nor its addresses,
// the data dir or another VM's run directory exist.
//
// The jail is built by a re-exec of this binary that mounts the root
// inside the new mount namespace and pivot_roots into it (see package
// jail for why not SysProcAttr.Chroot): no mount is ever made in the
// host's namespace, so the jail leaves nothing on the host for Stop or a
// restarted caller to clean up, whenever the caller dies; the
// namespaces end with QEMU. A restarted caller re-attaches through the
// QMP socket in the run directory, which it bound itself.
//
// Boot does not trust that any of this happened: once QEMU serves QMP
// it reads QEMU's /proc status and namespaces and fails the boot of a
// jailed VM that lacks one. What a VM has, observed, is its
// vmm.Confinement (in its Handle, re-read by Recover). A host that
// cannot jail (not root, no namespaces, no pivot_root) or a QEMU
// without seccomp is logged as a warning once and named in
// Confinement.Missing; Config.Jail = JailRequire turns the missing jail
// into a Boot error instead.
//
// Each VM owns two goroutines: one reaps the QEMU process, one copies the
// console; Stop waits for both. No lock is held across I/O.
package qemu
