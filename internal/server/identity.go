package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"space/internal/errkind"
	"space/internal/store"
)

// workerIDFile holds a data dir's worker ID, written on its first start.
const workerIDFile = "worker.id"

// workerIdentity returns the ID of the worker whose data dir is dataDir:
// the one recorded there, or, on the first start, given (if set) or a
// new random one, recorded before it is used. An ID is never shared by
// two data dirs unless an operator names it twice, and it survives host
// renames; a given ID that differs from the recorded one is refused, since
// the store places that worker's sandboxes by the recorded one. legacy,
// if set, is the ID a data dir made before IDs were recorded had (its
// sandboxes carry it); it is used when such a dir has no record yet.
func workerIdentity(dataDir, given, legacy string) (string, error) {
	if given != "" && (!store.ValidID(given) || len(given) > 32) {
		return "", fmt.Errorf("worker id %.64q: want 1-32 characters of [A-Za-z0-9_.-]: %w", given, errkind.InvalidArgument)
	}
	path := filepath.Join(dataDir, workerIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !store.ValidID(id) || len(id) > 32 {
			return "", fmt.Errorf("%s: %.64q is not a worker id; fix or remove the file: %w", path, id, errkind.FailedPrecondition)
		}
		if given != "" && given != id {
			return "", fmt.Errorf("data dir %s belongs to worker %s, not %s: its sandboxes are recorded under %s (start it without an id, or with that one): %w",
				dataDir, id, given, id, errkind.FailedPrecondition)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	id := given
	if id == "" {
		if _, err := os.Stat(filepath.Join(dataDir, "worker")); err == nil && legacy != "" {
			id = legacy
		} else {
			id = randomWorkerID()
		}
	}
	if err := writeFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("record worker id: %w", err)
	}
	return id, nil
}

// randomWorkerID returns "w-" and 16 random lowercase base32 characters.
func randomWorkerID() string {
	var b [10]byte
	rand.Read(b[:])
	return "w-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// legacyWorkerID is the ID a standalone worker derived from its host name
// and data dir before IDs were recorded.
func legacyWorkerID(dataDir string) string {
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(host + "\x00" + dataDir))
	return "w-" + hex.EncodeToString(sum[:4])
}

// replicaIDFile holds a data dir's control-plane replica ID.
const replicaIDFile = "replica.id"

// replicaIdentity returns the ID of the control-plane replica whose data
// dir is dataDir, made and recorded on its first start. A restarted
// replica keeps it, so it knows the claims an earlier life left in the
// store for dead (the data dir is locked while a replica runs).
func replicaIdentity(dataDir string) (string, error) {
	return recordedIdentity(filepath.Join(dataDir, replicaIDFile), "replica", "cp-")
}

// instanceIDFile holds a standalone worker data dir's instance ID.
const instanceIDFile = "worker.instance"

// instanceIdentity returns the ID of the data dir dataDir itself, made
// and recorded on its first start: a worker's Lease names it, so that a
// restarted worker takes over the Lease of its earlier life at once
// (the data dir is locked while a worker runs) while another process
// with the same worker ID is refused (package workerlease).
func instanceIdentity(dataDir string) (string, error) {
	return recordedIdentity(filepath.Join(dataDir, instanceIDFile), "instance", "i-")
}

// recordedIdentity returns the ID (of what) recorded in path, or makes a
// random one beginning with prefix and records it.
func recordedIdentity(path, what, prefix string) (string, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !store.ValidID(id) || len(id) > 32 {
			return "", fmt.Errorf("%s: %.64q is not a %s id; fix or remove the file: %w", path, id, what, errkind.FailedPrecondition)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	id := prefix + strings.TrimPrefix(randomWorkerID(), "w-")
	if err := writeFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("record %s id: %w", what, err)
	}
	return id, nil
}
