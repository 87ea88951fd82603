package server

import (
	"errors"
	"strings"
	"testing"

	"space/internal/errkind"
)

// TestLeaderElectionOutsideACluster checks a server told to elect on a
// Kubernetes Lease outside a cluster refuses to start, saying why, and
// that an unknown election is a bad argument.
func TestLeaderElectionOutsideACluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tt := range []struct {
		election string
		kind     error
		says     string
	}{
		{LeaderKubernetes, errkind.FailedPrecondition, "not in a cluster"},
		{"zookeeper", errkind.InvalidArgument, "want store or kubernetes"},
	} {
		err := Run(t.Context(), Config{DataDir: t.TempDir(), CacheBase: t.TempDir(), VMM: VMMFake, NoWorker: true, LeaderElection: tt.election})
		if !errors.Is(err, tt.kind) || !strings.Contains(fmtErr(err), tt.says) {
			t.Errorf("Run with leader election %q = %v, want %v saying %q", tt.election, err, tt.kind, tt.says)
		}
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
