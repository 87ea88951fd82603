package guestvm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
)

// Identity is what tells one guest machine from another besides its
// hostname: its machine-id (/etc/machine-id) and the boot_id its
// processes read (/proc/sys/kernel/random/boot_id). A restore copies both
// from the snapshot, so every restore and fork gets new ones.
type Identity struct {
	MachineID string // 32 lowercase hex digits
	BootID    string // a UUID as the kernel shows it; "" = the kernel's own
}

// NewIdentity draws a machine-id and a boot_id from the host's
// crypto/rand, both version 4 UUIDs as systemd and the kernel make them.
// The host draws them rather than the guest: right after a restore the
// guest's RNG is only as fresh as the entropy the host sends with them.
func NewIdentity() Identity {
	var m, b [16]byte
	rand.Read(m[:])
	rand.Read(b[:])
	m, b = uuid4(m), uuid4(b)
	bh := hex.EncodeToString(b[:])
	return Identity{
		MachineID: hex.EncodeToString(m[:]),
		BootID:    bh[:8] + "-" + bh[8:12] + "-" + bh[12:16] + "-" + bh[16:20] + "-" + bh[20:],
	}
}

// uuid4 sets the version and variant bits of a random UUID.
func uuid4(u [16]byte) [16]byte {
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// PostRestore gives a guest restored or forked from a snapshot what it
// must not share with the snapshot's other clones: the clock, fresh
// entropy for its RNG, hostname (kept when "") and a fresh Identity, which
// it returns. Every restore goes through it (guestvm.Restore, the
// worker's pool handover).
//
// An agent from before identities (in an older snapshot) refuses the
// fields; the call is then made again without them, and the returned
// Identity is zero: the guest keeps its snapshot's machine-id and boot_id.
// The caller reports that.
func PostRestore(ctx context.Context, c *client.Client, hostname string) (Identity, error) {
	return postRestore(ctx, c, hostname, NewIdentity())
}

func postRestore(ctx context.Context, c *client.Client, hostname string, id Identity) (Identity, error) {
	seed := make([]byte, 64)
	rand.Read(seed)
	pr := proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: seed, Hostname: hostname,
		MachineID: id.MachineID, BootID: id.BootID}
	err := c.PostRestore(ctx, pr)
	if err == nil || !errors.Is(err, errkind.InvalidArgument) || ctx.Err() != nil {
		return id, err
	}
	// What the host sends is valid, so the agent did not know the fields.
	// The refusal changed nothing in the guest.
	pr.MachineID, pr.BootID = "", ""
	if err2 := c.PostRestore(ctx, pr); err2 != nil {
		return Identity{}, fmt.Errorf("%w (and with a machine and boot id: %v)", err2, err)
	}
	return Identity{}, nil
}
