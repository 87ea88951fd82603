package server

import (
	"cmp"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"

	"space/internal/errkind"
	kubeapi "space/internal/kube"
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

// kubeClient returns the client and namespace of the API server the
// server's or worker's Kubernetes adapters use (what is for says which,
// in errors): kubeconfig's, or the pod's cluster's; namespace "" = the
// pod's.
func kubeClient(what, kubeconfig, namespace string) (kubernetes.Interface, string, error) {
	client, err := kubeapi.Client(kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	ns, err := kubeapi.Namespace(namespace)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", what, err)
	}
	return client, ns, nil
}

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
	client, ns, err := kubeClient("leader election on a Kubernetes Lease", cfg.Kubeconfig, cfg.KubeNamespace)
	if err != nil {
		return nil, err
	}
	return func(holder string) (leader.Elector, error) {
		return kube.New(kube.Config{Namespace: ns, Name: cmp.Or(cfg.KubeLease, "space-leader"), Holder: holder, Log: log}, client)
	}, nil
}
