// Package fake is a vmm.Driver for control-plane tests and load tests:
// its "guests" are jailed host processes that serve the agent protocol,
// not virtual machines. It is NOT a sandbox. Code in a fake guest runs on
// the host's kernel, with the host's binaries; only internal/jail stands
// between it and the host. Never run untrusted code on it.
//
// # Model
//
// Boot starts a real child process: this very binary, re-executed through
// internal/jail (new mount, PID, network, IPC and UTS namespaces,
// pivot_root, an unprivileged uid, no capabilities, no_new_privs) under
// the name "space-fakevm". The package's init function recognizes that
// name, so any binary that links this package (test binaries included)
// can be a fake guest. The guest serves internal/agent/server on a unix
// stream socket the driver listens on in the run dir (Handle.Agent kind
// "unix"), so exec, files, processes and PTYs go through the normal
// worker code. A boot takes milliseconds.
//
// The guest's root holds the host's /usr, /bin, /sbin, /lib and /lib64
// read-only, a few device nodes, a devpts of its own, writable /tmp,
// /root, /home and /work, and the host's /etc through an overlay whose
// upper layer is the guest's (writes never reach the host's /etc; the
// guest's user may write only in /etc/space and /etc/ssl/certs, where the
// worker installs the sandbox's CA). Those are directories of the sandbox: next
// to its writable disk (Spec.Disks, <disk>.fake/), or in the run dir for a
// spec without one. The guest runs as an unprivileged user: an exec as
// another user fails with errkind.PermissionDenied. There is no network: the guest's namespace has only a
// loopback device that is down, and Spec.NIC is ignored, as are the
// kernel, initrd, cmdline, VCPUs and MemoryMiB.
//
// The child is the process of the Handle: killing the worker (even with
// SIGKILL) leaves it running, and Recover re-attaches by pid and
// /proc start time, as the QEMU driver does.
//
// Pause stops every process of the guest's PID namespace with SIGSTOP (a
// paused guest's agent does not answer); Resume continues them. A
// snapshot is a directory holding fake.json (Driver "fake", Version) and
// guest.tar, the guest's writable directories (one regular file, so a
// worker's chunk store keeps all of it): processes, and anything only
// in their memory, are NOT preserved. Restore boots a new guest on an
// unpacked copy of those directories.
//
// Failure injection: Config.Faults and Driver.SetFault make named points
// (the Point constants) fail or hang, for tests of the code above.
//
// Without root, Boot and Restore fail with errkind.FailedPrecondition: the
// jail needs root, and the fake never runs a guest unjailed.
//
// Lock order: Driver.mu and VM.mu are taken alone.
package fake
