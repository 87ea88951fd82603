package helmchart

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Prometheus Operator's kinds the chart makes (monitoring.coreos.com/v1),
// with the fields of its CRDs that the chart sets: the operator's Go module
// would bring the operator's whole dependency tree for two structs. A field
// outside them fails the strict decode, so a template cannot set a
// misspelt one unnoticed; a field the chart starts to use is added here,
// under the CRD's name for it.

// MonitoringGroupVersion is the Prometheus Operator's API group and version.
var MonitoringGroupVersion = schema.GroupVersion{Group: "monitoring.coreos.com", Version: "v1"}

// ServiceMonitor is a monitoring.coreos.com/v1 ServiceMonitor.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ServiceMonitorSpec `json:"spec"`
}

// ServiceMonitorSpec selects the Services whose endpoints are scraped.
type ServiceMonitorSpec struct {
	// JobLabel is the Service's label whose value names the job.
	JobLabel          string                   `json:"jobLabel,omitempty"`
	Selector          metav1.LabelSelector     `json:"selector"`
	NamespaceSelector NamespaceSelector        `json:"namespaceSelector,omitempty"`
	Endpoints         []ServiceMonitorEndpoint `json:"endpoints"`
}

// NamespaceSelector names the namespaces the Services are looked for in.
type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

// ServiceMonitorEndpoint is one scraped port of the selected Services.
type ServiceMonitorEndpoint struct {
	// Port is the Service port's name.
	Port          string `json:"port,omitempty"`
	Path          string `json:"path,omitempty"`
	Interval      string `json:"interval,omitempty"`
	ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
}

// PrometheusRule is a monitoring.coreos.com/v1 PrometheusRule.
type PrometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PrometheusRuleSpec `json:"spec"`
}

// PrometheusRuleSpec is a Prometheus rules file's content.
type PrometheusRuleSpec struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is a group of rules evaluated together.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (s *ServiceMonitor) DeepCopyObject() runtime.Object { return deepCopy(s) }

// DeepCopyObject implements runtime.Object.
func (r *PrometheusRule) DeepCopyObject() runtime.Object { return deepCopy(r) }

// deepCopy copies v through JSON, which holds all of these types say.
func deepCopy[T any, P interface {
	*T
	runtime.Object
}](v P) runtime.Object {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	out := P(new(T))
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

// addMonitoringTypes registers the kinds above with s.
func addMonitoringTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(MonitoringGroupVersion, &ServiceMonitor{}, &PrometheusRule{})
	return nil
}
