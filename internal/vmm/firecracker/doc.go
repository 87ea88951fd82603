// Package firecracker boots, snapshots and restores guest VMs under
// Firecracker, optionally inside its jailer.
//
// A [Driver] starts one firecracker process per [VM] and configures it
// over its API socket (package fcapi). Firecracker resolves every path it
// is given against its root: the VM's run directory, or the chroot when
// jailed. The driver gives it relative names only, so that a snapshot
// (which records the names) restores into any root:
//
//	fc.sock      the API socket
//	vsock.sock   the hybrid vsock socket; the agent listens on guest port [AgentPort]
//	vmm.fifo     Firecracker's log, copied into firecracker.log by the VM
//	d0, d1, ...  the disks: symlinks to Spec.Disks (jailed: hard links)
//	vmlinux, initrd   jailed only: links or copies of the boot files
//
// and in the run directory, kept after Stop:
//
//	console.log      Firecracker's stdout: the guest's serial console
//	firecracker.log  Firecracker's stderr and log
//
// Both logs are plain append-only files handed to Firecracker, so nothing
// blocks or breaks when the calling process is gone (a pipe would: a
// Firecracker that gets SIGPIPE exits). While a VM object exists it caps
// each at Config.LogLimit, moving the previous part to console.old.log and
// firecracker.old.log.
//
// Lifecycle. Boot starts Firecracker in its own process group without a
// parent-death signal (VMs outlive a restart of the caller), in the NIC's
// network namespace (Firecracker opens the tap itself), waits for the API
// socket, configures logger, machine, boot source, drives, vsock, network,
// entropy device (1.4+) and a balloon for its free page reporting (1.14+,
// never inflated), and starts the instance. Detach lets go of a VM
// without stopping it; Recover re-attaches from its [vmm.Handle]: pid plus
// start time identify the process, a pidfd tells when it exits. Stop sends
// SIGTERM (Firecracker installs no handler for it, so it ends at once,
// like a power cut), SIGKILL after Config.StopGrace, then removes sockets,
// links and the jail. A clean guest shutdown is the guest's business: on
// x86 a guest reboot (reboot=k) ends Firecracker, a power-off does not.
//
// Snapshots. [VM.Snapshot] pauses the VM if it runs, has Firecracker write
// vmstate and memory into a new directory, copies the writable disks
// beside them, writes snapshot.json ([Metadata]) and resumes the VM.
// [Driver.Restore] places the disk copies where the spec says and loads
// the snapshot into a fresh process with the File memory backend: guest
// memory is a private copy-on-write mapping of the memory file, which must
// stay unchanged while any restored VM lives. Only the Firecracker version
// that wrote a snapshot can load it.
//
// Concurrency. Driver and VM methods are safe for concurrent use. A VM
// owns up to three goroutines (process waiter, log copier, log capper);
// Stop waits for them (the waiter ends with the process). VM.mu guards
// only snapshot bookkeeping and is never held across I/O.
package firecracker
