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
// Each VM owns two goroutines: one reaps the QEMU process, one copies the
// console; Stop waits for both. No lock is held across I/O.
package qemu
