package fake

import (
	"context"
	"fmt"

	"space/internal/errkind"
)

// Point names a place where the driver can be made to fail.
type Point string

// The failure points.
const (
	PointBoot     Point = "boot"     // Boot returns the fault's error
	PointAgent    Point = "agent"    // the guest starts, its agent never answers (holds connections open, silent)
	PointSnapshot Point = "snapshot" // Snapshot
	PointRestore  Point = "restore"  // Restore
	PointPause    Point = "pause"    // Pause
	PointResume   Point = "resume"   // Resume
	PointStop     Point = "stop"     // Stop, before it does anything: the guest runs on
	// PointExitAfterBoot: the guest process exits (status 1) right after
	// it started; Boot itself succeeds.
	PointExitAfterBoot Point = "exit-after-boot"
)

var points = map[Point]bool{
	PointBoot: true, PointAgent: true, PointSnapshot: true, PointRestore: true,
	PointPause: true, PointResume: true, PointStop: true, PointExitAfterBoot: true,
}

// Fault is what happens at a Point. For PointAgent and PointExitAfterBoot
// any fault other than NoFault has the effect the point describes, on
// guests booted or restored from then on.
type Fault int

// The faults.
const (
	NoFault Fault = iota
	Fail          // the call returns an error that wraps ErrInjected
	Hang          // the call blocks until its ctx ends, then returns ctx's cause
)

// ErrInjected is wrapped by the errors that Fail faults cause.
var ErrInjected = fmt.Errorf("injected fault: %w", errkind.Unavailable)

// SetFault makes point p fail as f from now on; NoFault clears it. An
// unknown point or fault is errkind.InvalidArgument. Safe for concurrent
// use, also with calls in progress (they see the fault or not).
func (d *Driver) SetFault(p Point, f Fault) error {
	if !points[p] {
		return fmt.Errorf("fault point %q: %w", p, errkind.InvalidArgument)
	}
	if f < NoFault || f > Hang {
		return fmt.Errorf("fault %d at %q: %w", f, p, errkind.InvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if f == NoFault {
		delete(d.faults, p)
	} else {
		d.faults[p] = f
	}
	return nil
}

func (d *Driver) faultAt(p Point) Fault {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.faults[p]
}

// fault applies the fault at p, if any.
func (d *Driver) fault(ctx context.Context, p Point) error {
	switch d.faultAt(p) {
	case Fail:
		return fmt.Errorf("at %s: %w", p, ErrInjected)
	case Hang:
		return fmt.Errorf("hang at %s: %w", p, waitCtx(ctx))
	}
	return nil
}
