// Package chartcluster holds the test of the Helm chart on a real one-node
// Kubernetes cluster (test tier k8s, internal/testenv/kubetest): the
// images `make images` builds, installed with helm on two control-plane
// replicas on PostgreSQL and one worker running real VMs, driven through
// the chart's API Service while its pods are deleted, upgraded and
// uninstalled. It has no code of its own outside the test.
package chartcluster
