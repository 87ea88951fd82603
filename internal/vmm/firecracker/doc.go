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
// blocks or breaks when the calling process is gone; while a VM object
// exists it caps each at Config.LogLimit (rotating once to <name>.1).
//
// Lifecycle. Boot starts Firecracker in its own process group without a
// parent-death signal (VMs outlive a restart of the caller), waits for the
// API socket, configures logger, machine, boot source, drives, vsock,
// network and entropy device, and starts the instance. Recover re-attaches
// to a VM from its [vmm.Handle]: pid plus start time identify the process,
// a pidfd tells when it exits. Stop sends SIGTERM (Firecracker installs no
// handler for it, so it ends at once, like a power cut), SIGKILL after
// Config.StopGrace, then removes sockets, links and the jail. A clean
// guest shutdown is the guest's business: on x86 a guest reboot (reboot=k)
// ends Firecracker, a power-off does not.
//
// Snapshots. [VM.Snapshot] writes vmstate, memory and snapshot.json
// ([Metadata]) into a directory; [Driver.Restore] loads them into a fresh
// process with the File memory backend, so the memory file must stay
// unchanged while any restored VM lives. Disk contents are not part of a
// snapshot: the caller copies writable disks while the VM is paused.
//
// Concurrency. Driver and VM methods are safe for concurrent use. A VM
// owns up to three goroutines (process waiter, log copier, log capper);
// Stop waits for them. VM.mu guards only snapshot bookkeeping and is never
// held across I/O.
package firecracker
