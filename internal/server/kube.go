package server

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"space/internal/errkind"
	"space/internal/leader"
	"space/internal/leader/kube"
)

// The leader elections a server can take part in (Config.LeaderElection).
const (
	// LeaderStore elects on the store's leader lease (the default).
	LeaderStore = "store"
	// LeaderKubernetes elects on a coordination.k8s.io Lease in the
	// server's namespace, through the API server of the cluster it runs
	// in (its pod's service account).
	LeaderKubernetes = "kubernetes"
)

// serviceAccountNamespace is where a pod's namespace is mounted.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// electorFor returns the elector Config.LeaderElection names, or nil
// for the store's.
func electorFor(cfg Config, log *slog.Logger) (func(holder string) (leader.Elector, error), error) {
	switch cfg.LeaderElection {
	case "", LeaderStore:
		return nil, nil
	case LeaderKubernetes:
	default:
		return nil, fmt.Errorf("leader election %q: want %s or %s: %w", cfg.LeaderElection, LeaderStore, LeaderKubernetes, errkind.InvalidArgument)
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("leader election on a Kubernetes Lease: not in a cluster: %v: %w", err, errkind.FailedPrecondition)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("leader election on a Kubernetes Lease: %w", err)
	}
	ns := cfg.KubeNamespace
	if ns == "" {
		b, err := os.ReadFile(serviceAccountNamespace)
		if err != nil {
			return nil, fmt.Errorf("leader election on a Kubernetes Lease: namespace: %v (give --kube-namespace): %w", err, errkind.FailedPrecondition)
		}
		ns = strings.TrimSpace(string(b))
	}
	return func(holder string) (leader.Elector, error) {
		return kube.New(kube.Config{Namespace: ns, Name: cmp.Or(cfg.KubeLease, "space-leader"), Holder: holder, Log: log}, client)
	}, nil
}
