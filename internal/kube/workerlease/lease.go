// Package workerlease makes standalone workers discoverable through the
// Kubernetes API instead of registration over HTTP: each worker publishes
// a coordination.k8s.io/v1 Lease, space-worker-<id>, carrying what it
// would register (its address, worker protocol, capabilities, capacity)
// in annotations and renewed every 10 s ([Publisher]); every
// control-plane replica watches those Leases and connects the workers
// they name, alive while a Lease is renewed ([Watcher]).
//
// A Lease's holderIdentity is the worker's id and the life of the process
// publishing it (<id>/<life>): a second process with the same id is
// refused while the first's Lease is alive, unless both say they are the
// same instance (one data dir, whose lock makes the earlier life dead).
//
// Lock order: the Publisher and the Watcher hold no locks across
// requests; Watcher.mu is a leaf.
package workerlease

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"space/api"
	"space/internal/errkind"
	kubeapi "space/internal/kube"
)

// The labels every worker Lease carries; Selector selects them.
const (
	LabelComponent = "app.kubernetes.io/component"
	LabelLease     = "space.dev/worker-lease"
	Selector       = LabelLease + "=true"
)

// The annotations that carry what a worker registers (api.RegisterWorker).
const (
	AnnotationID           = "space.dev/worker-id"
	AnnotationAddress      = "space.dev/worker-address"
	AnnotationProtocol     = "space.dev/worker-protocol"
	AnnotationCapabilities = "space.dev/worker-capabilities" // JSON of api.WorkerCapabilities
	AnnotationVCPUs        = "space.dev/worker-vcpus"
	AnnotationMemoryMiB    = "space.dev/worker-memory-mib"
	// AnnotationInstance names the instance (data dir) of the process
	// holding the Lease; see Config.Instance.
	AnnotationInstance = "space.dev/worker-instance"
)

// Defaults of a worker Lease's timing.
const (
	DefaultDuration   = 30 * time.Second
	DefaultRenewEvery = 10 * time.Second
)

// namePrefix begins every worker Lease's name.
const namePrefix = "space-worker-"

var dnsUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// Name is the name of worker id's Lease: space-worker-<id>, or for an id
// that is not a DNS label as it stands (capitals, '_', '.'), its
// lowercase form with those replaced by '-' and a hash of the id
// appended, so that two ids never share a Lease.
func Name(id string) string {
	if len(validation.IsDNS1123Label(namePrefix+id)) == 0 {
		return namePrefix + id
	}
	sum := sha256.Sum256([]byte(id))
	safe := strings.Trim(dnsUnsafe.ReplaceAllString(strings.ToLower(id), "-"), "-")
	return namePrefix + safe + "-" + hex.EncodeToString(sum[:4])
}

// annotations encodes reg as a Lease's annotations.
func annotations(reg api.RegisterWorker, instance string) (map[string]string, error) {
	caps, err := json.Marshal(reg.Capabilities)
	if err != nil {
		return nil, fmt.Errorf("capabilities: %w", err)
	}
	a := map[string]string{
		AnnotationID:           reg.ID,
		AnnotationAddress:      reg.Address,
		AnnotationProtocol:     strconv.Itoa(reg.Protocol),
		AnnotationCapabilities: string(caps),
		AnnotationVCPUs:        strconv.Itoa(reg.VCPUs),
		AnnotationMemoryMiB:    strconv.FormatInt(reg.MemoryMiB, 10),
	}
	if instance != "" {
		a[AnnotationInstance] = instance
	}
	return a, nil
}

// registration decodes what Lease l says its worker registers, and when
// it was renewed for how long. Errors wrap errkind.InvalidArgument.
func registration(l *coordinationv1.Lease) (reg api.RegisterWorker, renewed time.Time, d time.Duration, err error) {
	a := l.Annotations
	bad := func(what string, err error) error {
		return fmt.Errorf("lease %s: %s: %v: %w", l.Name, what, err, errkind.InvalidArgument)
	}
	reg.ID, reg.Address = a[AnnotationID], a[AnnotationAddress]
	if reg.ID == "" {
		return reg, renewed, d, bad(AnnotationID, fmt.Errorf("missing"))
	}
	if Name(reg.ID) != l.Name {
		return reg, renewed, d, bad(AnnotationID, fmt.Errorf("%.64q is not the id of this lease's worker", reg.ID))
	}
	if holder := kubeapi.Deref(l.Spec.HolderIdentity); !strings.HasPrefix(holder, reg.ID+"/") {
		return reg, renewed, d, bad("holderIdentity", fmt.Errorf("%.100q is not held by worker %s", holder, reg.ID))
	}
	if reg.Protocol, err = strconv.Atoi(a[AnnotationProtocol]); err != nil {
		return reg, renewed, d, bad(AnnotationProtocol, err)
	}
	if reg.VCPUs, err = strconv.Atoi(a[AnnotationVCPUs]); err != nil {
		return reg, renewed, d, bad(AnnotationVCPUs, err)
	}
	if reg.MemoryMiB, err = strconv.ParseInt(a[AnnotationMemoryMiB], 10, 64); err != nil {
		return reg, renewed, d, bad(AnnotationMemoryMiB, err)
	}
	if err := json.Unmarshal([]byte(a[AnnotationCapabilities]), &reg.Capabilities); err != nil {
		return reg, renewed, d, bad(AnnotationCapabilities, err)
	}
	if l.Spec.RenewTime == nil || kubeapi.Deref(l.Spec.LeaseDurationSeconds) <= 0 {
		return reg, renewed, d, bad("spec", fmt.Errorf("no renewTime or leaseDurationSeconds"))
	}
	return reg, l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second, nil
}

// expired reports whether l was not renewed within its duration before now.
func expired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil {
		return true
	}
	d := time.Duration(kubeapi.Deref(l.Spec.LeaseDurationSeconds)) * time.Second
	return !now.Before(l.Spec.RenewTime.Add(d))
}
