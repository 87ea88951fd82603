// Package worker owns one host's sandboxes: it turns "sandbox X should run
// with spec S" into a VMM process in its own control group, a writable
// disk layer, run files and an agent connection, and it serves the
// sandbox's data plane (exec, processes, files) over HTTP. The control
// plane manages it through the worker protocol (package workerproto):
// Worker implements workerproto.Service, and Handler serves its verbs.
//
// # Records and recovery
//
// Every sandbox has a record in DataDir/sandboxes/<id>/record.json,
// written (atomically, fsynced) before each step it describes is
// acknowledged: the record exists before anything is created, holds the
// VMM handle as soon as the VMM runs, and says "running" only once the
// agent answered. A worker that restarts (after kill -9 or SIGTERM: Close
// leaves VMs running) reads its records and
//   - re-adopts running VMs through their handles (same VMM process);
//   - completes a create whose VM came up, or rolls it back;
//   - finishes a delete that was under way;
//   - removes what no record points to: control groups under
//     space-<worker id>, run directories under RunRoot and sandbox
//     directories without a record.
//
// Everything the worker creates on the host carries its ID (the run root,
// the cgroup parent), so two workers on one host never touch each other's
// sandboxes. Only Delete, and a failed create, destroy a VM.
//
// # Fencing
//
// Once the leader's lease (the Lease verb) has been taken, the worker
// serves its sandboxes only while one holds; when it runs out the fence
// pauses their guests (without recording them paused) and the data plane
// answers 503 until a lease comes again. A newer fencing epoch removes
// the sandboxes the leader took away, before the epoch is recorded in
// DataDir. See fence.go.
//
// # Crash points
//
// Config.CrashAt names a step at which the process kills itself with
// SIGKILL; tests use it to crash at exactly that step (see CrashPoints).
//
// # Locking
//
// Worker.mu guards the sandbox map and the fence's state. Each sandbox has op, held for the
// whole of a lifecycle operation (create, delete, recover) so they never
// interleave, vcpus, held across one pause or resume of its VM (by its
// user or the fence), and mu, which guards its fields and is never held
// across I/O. Worker.admit serializes admitting new sandboxes against
// capacity; Worker.lease serializes Lease calls, across their removals.
// Lock order: Worker.lease, then sandbox.op, then sandbox.vcpus, then
// Worker.admit, then Worker.mu, then sandbox.mu.
package worker
