// Package kindconfig reads Kind cluster configs (deploy/kind/cluster.yaml)
// into kind's own v1alpha4 types, as strictly as kind does.
package kindconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"

	"space/internal/errkind"
)

// APIVersion and Kind are the only type of config Parse takes.
const (
	APIVersion = "kind.x-k8s.io/v1alpha4"
	Kind       = "Cluster"
)

// Load parses the config in the file at path (see [Parse]).
func Load(path string) (*v1alpha4.Cluster, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load kind config: %w", err)
	}
	c, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes one YAML document holding a kind.x-k8s.io/v1alpha4
// Cluster, the way `kind create cluster --config` does: by the types'
// yaml tags, refusing a field they lack, and then defaulted as kind
// defaults it (no nodes: one control plane; a node without a role: a
// control plane). It also refuses what kind would refuse when it creates
// the cluster: an unknown node role, an extra mount without an absolute
// container path or with an unknown propagation. Errors wrap
// [errkind.InvalidArgument].
func Parse(raw []byte) (*v1alpha4.Cluster, error) {
	var c v1alpha4.Cluster
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode kind config: %w: %w", err, errkind.InvalidArgument)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode kind config: more than one document: %w", errkind.InvalidArgument)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("kind config is %s %q, want %s %q: %w", c.APIVersion, c.Kind, APIVersion, Kind, errkind.InvalidArgument)
	}
	v1alpha4.SetDefaultsCluster(&c)
	for i, n := range c.Nodes {
		if n.Role != v1alpha4.ControlPlaneRole && n.Role != v1alpha4.WorkerRole {
			return nil, fmt.Errorf("kind config: node %d: unknown role %q: %w", i, n.Role, errkind.InvalidArgument)
		}
		for _, m := range n.ExtraMounts {
			if len(m.ContainerPath) == 0 || m.ContainerPath[0] != '/' || m.HostPath == "" {
				return nil, fmt.Errorf("kind config: node %d: mount %q on %q: want a host path and an absolute container path: %w", i, m.HostPath, m.ContainerPath, errkind.InvalidArgument)
			}
			switch m.Propagation {
			case "", v1alpha4.MountPropagationNone, v1alpha4.MountPropagationHostToContainer, v1alpha4.MountPropagationBidirectional:
			default:
				return nil, fmt.Errorf("kind config: node %d: mount on %q: unknown propagation %q: %w", i, m.ContainerPath, m.Propagation, errkind.InvalidArgument)
			}
		}
	}
	return &c, nil
}

// Selected returns the nodes of c whose labels include every label in
// selector, as a pod's nodeSelector picks nodes. Kind labels each node
// with what its config says; the labels Kubernetes adds itself are not
// seen here.
func Selected(c *v1alpha4.Cluster, selector map[string]string) []v1alpha4.Node {
	var out []v1alpha4.Node
	for _, n := range c.Nodes {
		match := true
		for k, v := range selector {
			if got, ok := n.Labels[k]; !ok || got != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, n)
		}
	}
	return out
}

// Mount returns the extra mount of n at containerPath, or false.
func Mount(n v1alpha4.Node, containerPath string) (v1alpha4.Mount, bool) {
	for _, m := range n.ExtraMounts {
		if m.ContainerPath == containerPath {
			return m, true
		}
	}
	return v1alpha4.Mount{}, false
}
