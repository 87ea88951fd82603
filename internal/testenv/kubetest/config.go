package kubetest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// The machine-wide layout of the cluster: one at a time per machine, so
// every name and address is fixed, and a killed run's leftovers are found
// where the next run looks for them.
const (
	// StateDir holds everything the cluster writes: PKI, configs, etcd,
	// containerd, the kubelet's root, pod logs, pid files, logs.
	StateDir = "/var/lib/space-kubetest"
	// lockDir holds the machine-wide lock Start holds until cleanup.
	lockDir = "/run/space-kubetest"

	// NodeName is the name of the one node (the kubelet's hostname
	// override, so the apiserver reaches it at localhost).
	NodeName = "localhost"
	// nodeIface is the interface (dummy or ifb) that carries the node address.
	nodeIface = "spacek8s0"
	// bridgeIface is the CNI bridge of the pod network.
	bridgeIface = "spacek8sbr0"
	// cniNetwork names the CNI network (and its host-local IPAM state).
	cniNetwork = "spacek8s"

	apiPort  = 6443
	etcdPort = 12379 // client; the peer port is etcdPort+1; off the default ports
	// PodCIDR is the pod network's range; its first address is the
	// bridge (the pods' gateway), an address of the host.
	PodCIDR = "10.252.0.0/24"
	// ServiceCIDR is the ClusterIP range.
	ServiceCIDR = "10.96.0.0/24"

	pauseImage = "localhost/space-kubetest-pause:1"
)

var (
	// nodeIP is the node address: on nodeIface, an address of no network
	// the machine is on. The apiserver binds and advertises it, so the
	// kubernetes Service's endpoint is this address.
	nodeIP    = net.IPv4(10, 251, 0, 1).To4()
	serviceIP = net.IPv4(10, 96, 0, 1).To4()
	bridgeIP  = net.IPv4(10, 252, 0, 1).To4()
)

// paths are the files and directories under StateDir.
type paths struct{ root string }

func (p paths) join(elem ...string) string {
	return filepath.Join(append([]string{p.root}, elem...)...)
}
func (p paths) pki() string  { return p.join("pki") }
func (p paths) pids() string { return p.join("pids") }
func (p paths) logs() string { return p.join("logs") }
func (p paths) kubeconfig(n string) string {
	return p.join("kubeconfig", n+".yaml")
}
func (p paths) containerdSock() string { return p.join("containerd", "containerd.sock") }
func (p paths) cniConfDir() string     { return p.join("cni", "net.d") }
func (p paths) podLogs() string        { return p.join("pod-logs") }
func (p paths) kubeletRoot() string    { return p.join("kubelet") }

func writeFile(name, content string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	return os.WriteFile(name, []byte(content), mode)
}

func apiURL() string { return fmt.Sprintf("https://%s:%d", nodeIP, apiPort) }

// writeKubeconfig writes the kubeconfig of the client certificate cert.
func writeKubeconfig(p paths, cert string) error {
	pki := p.pki()
	return writeFile(p.kubeconfig(cert), fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: kubetest
  context: {cluster: kubetest, user: %s}
current-context: kubetest
`, apiURL(), filepath.Join(pki, "ca.crt"), cert, filepath.Join(pki, cert+".crt"), filepath.Join(pki, cert+".key"), cert), 0o600)
}

// writeConfigs writes the containerd, CNI, kubelet and kube-proxy
// configuration files and every component's kubeconfig.
func writeConfigs(p paths) error {
	for _, c := range []string{certAdmin, certKCM, certScheduler, certKubelet, certKubeProxy} {
		if err := writeKubeconfig(p, c); err != nil {
			return err
		}
	}
	// containerd 1.6 (Debian 12). restrict_oom_score_adj: root here may
	// lack CAP_SYS_RESOURCE, and runc fails every container that would
	// lower its oom_score_adj. Root and state live under StateDir; only
	// the shims' sockets (/run/containerd/s) cannot be moved.
	containerd := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[7]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[8]q
`, p.join("containerd", "root"), p.join("containerd", "state"), p.containerdSock(), p.containerdSock()+".ttrpc",
		p.join("containerd", "opt"), pauseImage, p.join("runc"), p.cniConfDir())
	if err := writeFile(p.join("containerd", "config.toml"), containerd, 0o644); err != nil {
		return err
	}
	// The bridge is the pods' gateway, so host and pods route to each
	// other; hairpin mode lets a pod reach itself through a Service.
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
`, cniNetwork, bridgeIface, p.join("cni", "ipam"), PodCIDR, bridgeIP)
	if err := writeFile(filepath.Join(p.cniConfDir(), "10-spacek8s.conflist"), cni, 0o644); err != nil {
		return err
	}
	pki := p.pki()
	// cgroupfs works on cgroup v1 and v2 and needs no systemd. The
	// eviction and image GC thresholds keep pre-loaded images (never
	// pullable here) and keep a busy disk from evicting test pods.
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[1]q}
authorization: {mode: Webhook}
tlsCertFile: %[2]q
tlsPrivateKeyFile: %[3]q
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: %[4]q
podLogsDir: %[5]q
volumePluginDir: %[6]q
evictionHard:
  memory.available: "10Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
rotateCertificates: false
serverTLSBootstrap: false
resolvConf: /etc/resolv.conf
maxPods: 110
`, filepath.Join(pki, "ca.crt"), filepath.Join(pki, "kubelet-serving.crt"), filepath.Join(pki, "kubelet-serving.key"),
		"unix://"+p.containerdSock(), p.podLogs(), p.join("volume-plugins"))
	if err := writeFile(p.join("kubelet-config.yaml"), kubelet, 0o644); err != nil {
		return err
	}
	// The conntrack settings are zero so kube-proxy leaves the host's
	// sysctls alone; localhostNodePorts off keeps route_localnet as is.
	proxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: %s:10256
metricsBindAddress: %s:10249
clusterCIDR: %s
nodePortAddresses: [%s/32]
iptables: {localhostNodePorts: false}
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, p.kubeconfig(certKubeProxy), NodeName, nodeIP, nodeIP, nodeIP, PodCIDR, nodeIP)
	return writeFile(p.join("kube-proxy-config.yaml"), proxy, 0o644)
}
