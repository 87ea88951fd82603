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

// How the control plane finds standalone workers (Config.WorkerDiscovery,
// WorkerConfig.Discovery).
const (
	// DiscoveryToken: workers register over HTTP with the worker token,
	// every controlplane.HeartbeatInterval (the default).
	DiscoveryToken = "token"
	// DiscoveryKubernetes: workers publish a coordination.k8s.io Lease
	// in a namespace, which the control plane watches (package
	// workerlease); for clusters where workers cannot reach the control
	// plane's Service.
	DiscoveryKubernetes = "kubernetes"
)

// discoveryClient returns the client and namespace of the workers'
// Leases if discovery is DiscoveryKubernetes, or nil for
// DiscoveryToken. given, if set, is the client to use (tests: a fake API
// server).
func discoveryClient(discovery, kubeconfig, namespace string, given kubernetes.Interface) (kubernetes.Interface, string, error) {
	switch discovery {
	case "", DiscoveryToken:
		return nil, "", nil
	case DiscoveryKubernetes:
	default:
		return nil, "", fmt.Errorf("worker discovery %q: want %s or %s: %w", discovery, DiscoveryToken, DiscoveryKubernetes, errkind.InvalidArgument)
	}
	if given != nil {
		ns, err := kubeapi.Namespace(namespace)
		return given, ns, err
	}
	return kubeClient("worker discovery through Kubernetes Leases", kubeconfig, namespace)
}
