// Package kube holds what SPACE's Kubernetes adapters share: reaching the
// API server, its errors as error kinds, and the arithmetic of Leases.
package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"space/internal/errkind"
)

// serviceAccountNamespace is where a pod's namespace is mounted.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Client returns a client of the API server that kubeconfig (a file)
// names, or with kubeconfig "" of the cluster this process runs in (its
// pod's service account). Outside a cluster without a kubeconfig, the
// error wraps errkind.FailedPrecondition and says so.
func Client(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("not in a cluster (give --kubeconfig): %v: %w", err, errkind.FailedPrecondition)
		}
	} else if rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %v: %w", kubeconfig, err, errkind.InvalidArgument)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, nil
}

// Namespace returns given, or if that is "" the namespace of this
// process's pod; outside a pod the error wraps
// errkind.FailedPrecondition.
func Namespace(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	b, err := os.ReadFile(serviceAccountNamespace)
	if err != nil {
		return "", fmt.Errorf("namespace: %v (give --kube-namespace): %w", err, errkind.FailedPrecondition)
	}
	return strings.TrimSpace(string(b)), nil
}

// Kind wraps an API error in its error kind.
func Kind(err error) error {
	switch {
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w: %w", errkind.Conflict, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %w", errkind.NotFound, err)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: %w", errkind.PermissionDenied, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", errkind.DeadlineExceeded, err)
	}
	return fmt.Errorf("%w: %w", errkind.Unavailable, err)
}

// DurationSeconds is d in whole seconds, rounded up, at least 1: a
// Lease's leaseDurationSeconds.
func DurationSeconds(d time.Duration) int32 {
	return int32(max(1, (d+time.Second-1)/time.Second))
}

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

// Deref returns *p, or the zero value if p is nil.
func Deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}
