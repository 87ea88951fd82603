// Package helmchart lints and renders SPACE's Helm chart (deploy/helm/space)
// with Helm's own packages, as helm lint and helm template do, without a
// cluster, and decodes what it renders into Kubernetes API objects.
package helmchart

import (
	"bytes"
	"fmt"
	"path"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"

	"space/internal/errkind"
)

// Release names the release a chart is rendered for.
type Release struct {
	Name      string // required
	Namespace string // required
}

// Rendered is what a chart renders to.
type Rendered struct {
	// Objects are the manifests decoded, in template path order and in
	// document order within a template.
	Objects []runtime.Object
	// Notes is what templates/NOTES.txt rendered to, or "".
	Notes string
}

// Load loads the chart in dir.
func Load(dir string) (*chart.Chart, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	return ch, nil
}

// Lint runs Helm's linter (helm lint) on the chart in dir with values
// over the chart's own, for a release in namespace, and returns its
// messages of every severity.
func Lint(dir string, values map[string]any, namespace string) []support.Message {
	return lint.RunAll(dir, values, namespace).Messages
}

// Render renders ch for rel with values over the chart's own, as helm
// template does: the values are checked against the chart's
// values.schema.json first, lookup finds nothing, and a template that
// reads a value the values lack fails. It decodes every manifest strictly
// (an unknown field fails) into the API types of the kinds the chart
// makes; errors wrap errkind.InvalidArgument when the values break the
// schema.
func Render(ch *chart.Chart, values map[string]any, rel Release) (*Rendered, error) {
	vals, err := renderValues(ch, values, rel)
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true}.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", ch.Name(), err)
	}
	return decodeFiles(ch.Name(), files)
}

// RenderWithLookup is Render with the lookup template function answered
// by lookup, as helm install and upgrade do against a cluster. Templates
// may read values the values lack (the engine's strict mode and its
// lookup do not go together).
func RenderWithLookup(ch *chart.Chart, values map[string]any, rel Release, lookup engine.ClientProvider) (*Rendered, error) {
	vals, err := renderValues(ch, values, rel)
	if err != nil {
		return nil, err
	}
	files, err := engine.RenderWithClientProvider(ch, vals, lookup)
	if err != nil {
		return nil, fmt.Errorf("render chart %s: %w", ch.Name(), err)
	}
	return decodeFiles(ch.Name(), files)
}

// renderValues merges values over ch's, checks them against its schema
// and adds the release's and the cluster's (Helm's default capabilities).
func renderValues(ch *chart.Chart, values map[string]any, rel Release) (common.Values, error) {
	if rel.Name == "" || rel.Namespace == "" {
		return nil, fmt.Errorf("render chart %s: release name and namespace are required: %w", ch.Name(), errkind.InvalidArgument)
	}
	merged, err := util.CoalesceValues(ch, values)
	if err != nil {
		return nil, fmt.Errorf("values of chart %s: %w", ch.Name(), err)
	}
	if err := util.ValidateAgainstSchema(ch, merged); err != nil {
		return nil, fmt.Errorf("values of chart %s break its schema: %w: %w", ch.Name(), err, errkind.InvalidArgument)
	}
	// The user's values, not merged: merging again would bring back the
	// defaults that a null in values removed.
	opts := common.ReleaseOptions{Name: rel.Name, Namespace: rel.Namespace, IsInstall: true, Revision: 1}
	return util.ToRenderValuesWithSchemaValidation(ch, values, opts, common.DefaultCapabilities.Copy(), true)
}

// decodeFiles decodes the rendered templates of the chart named name.
func decodeFiles(name string, files map[string]string) (*Rendered, error) {
	var r Rendered
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		switch {
		case p == path.Join(name, "templates", "NOTES.txt"):
			r.Notes = files[p]
		case strings.HasSuffix(p, ".yaml"):
			objs, err := Decode(files[p])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			r.Objects = append(r.Objects, objs...)
		}
	}
	return &r, nil
}

// scheme knows the API types of every kind the chart makes.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme, rbacv1.AddToScheme,
		addMonitoringTypes,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// Decode decodes a stream of YAML manifests into API objects, leaving out
// documents with nothing but comments. An unknown field, a kind outside
// core/v1, apps/v1, batch/v1, policy/v1, rbac.authorization.k8s.io/v1 and
// the Prometheus Operator's ServiceMonitor and PrometheusRule, or a value
// of the wrong type fails.
func Decode(manifests string) ([]runtime.Object, error) {
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	docs := releaseutil.SplitManifests(manifests)
	var objs []runtime.Object
	// SplitManifests names the documents manifest-0, manifest-1, ... in
	// the order they came.
	for i := range len(docs) {
		k := fmt.Sprintf("manifest-%d", i)
		var probe map[string]any
		if err := yaml.Unmarshal([]byte(docs[k]), &probe); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", k, err)
		}
		if len(probe) == 0 {
			continue
		}
		obj, _, err := dec.Decode(bytes.TrimSpace([]byte(docs[k])), nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode manifest %s: %w", k, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}
