package api

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

// loadSpec parses openapi.yaml into plain maps and slices.
func loadSpec(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("setup: parse openapi.yaml: %v", err)
	}
	return doc
}

// operation is one method of one path in the document.
type operation struct {
	method, path string
	op           map[string]any
	pathItem     map[string]any
}

func operations(t *testing.T, doc map[string]any) []operation {
	t.Helper()
	paths, ok := doc["paths"].(map[string]any)
	if !ok {
		t.Fatalf("setup: openapi.yaml has no paths map")
	}
	var ops []operation
	for path, v := range paths {
		item, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("setup: path %s is %T, want a map", path, v)
		}
		for key, v := range item {
			if !slices.Contains(openAPIMethods, key) {
				continue
			}
			op, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("setup: %s %s is %T, want a map", key, path, v)
			}
			ops = append(ops, operation{strings.ToUpper(key), path, op, item})
		}
	}
	return ops
}

func TestOpenAPIVersion(t *testing.T) {
	doc := loadSpec(t)
	if got := doc["openapi"]; got != "3.0.3" {
		t.Errorf("openapi = %v, want 3.0.3", got)
	}
	schemes, _ := doc["components"].(map[string]any)["securitySchemes"].(map[string]any)
	bearer, _ := schemes["bearer"].(map[string]any)
	if bearer["type"] != "http" || bearer["scheme"] != "bearer" {
		t.Errorf("securitySchemes.bearer = %v, want an http bearer scheme", bearer)
	}
}

func TestOpenAPIOperations(t *testing.T) {
	doc := loadSpec(t)
	ids := map[string]string{}
	for _, o := range operations(t, doc) {
		name := o.method + " " + o.path
		id, _ := o.op["operationId"].(string)
		if id == "" {
			t.Errorf("%s has no operationId", name)
		} else if prev, dup := ids[id]; dup {
			t.Errorf("%s and %s share operationId %q", prev, name, id)
		}
		ids[id] = name
		if resp, _ := o.op["responses"].(map[string]any); len(resp) == 0 {
			t.Errorf("%s has no responses", name)
		}
		declared := pathParams(t, doc, o.pathItem["parameters"])
		for p := range pathParams(t, doc, o.op["parameters"]) {
			declared[p] = true
		}
		for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(o.path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s does not declare path parameter %q", name, m[1])
			}
		}
	}
}

// pathParams returns the names of the "in: path" parameters in list,
// following $refs.
func pathParams(t *testing.T, doc map[string]any, list any) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	params, _ := list.([]any)
	for _, p := range params {
		m, _ := p.(map[string]any)
		if ref, ok := m["$ref"].(string); ok {
			r, err := resolve(doc, ref)
			if err != nil {
				t.Errorf("parameter %s: %v", ref, err)
				continue
			}
			m, _ = r.(map[string]any)
		}
		if m["in"] == "path" {
			names[fmt.Sprint(m["name"])] = true
		}
	}
	return names
}

// resolve follows a local reference ("#/components/schemas/Sandbox").
func resolve(doc map[string]any, ref string) (any, error) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, fmt.Errorf("not a local reference")
	}
	var cur any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%q is inside a non-object", tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("no %q", tok)
		}
	}
	return cur, nil
}

func TestOpenAPIRefsResolve(t *testing.T) {
	doc := loadSpec(t)
	var refs int
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				refs++
				if _, err := resolve(doc, ref); err != nil {
					t.Errorf("%s: $ref %s: %v", where, ref, err)
				}
			}
			for k, e := range v {
				walk(where+"/"+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s/%d", where, i), e)
			}
		}
	}
	walk("#", doc)
	if refs == 0 {
		t.Errorf("openapi.yaml has no $ref at all, want many")
	}
}

// TestOpenAPISchemasMatchTypes checks that each component schema has
// exactly the JSON fields of its Go type.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	types := map[string]any{
		"Error": Error{}, "ErrorBody": ErrorBody{}, "Health": Health{},
		"CreateSandbox": CreateSandbox{}, "Sandbox": Sandbox{}, "VMInfo": VMInfo{},
		"SandboxList": SandboxList{}, "Exec": Exec{}, "WinSize": WinSize{},
		"Process": Process{}, "ProcessList": ProcessList{}, "Exit": Exit{},
		"Event": Event{}, "Control": Control{}, "Signal": Signal{},
		"FileInfo": FileInfo{}, "MakeDir": MakeDir{}, "Move": Move{}, "FileEvent": FileEvent{}, "FileList": FileList{}, "FileWritten": FileWritten{}, "FileUpload": FileUpload{}, "TarWritten": TarWritten{}, "PortState": PortState{},
		"CreateAPIKey": CreateAPIKey{}, "APIKey": APIKey{}, "APIKeyList": APIKeyList{},
		"Quota": Quota{}, "QuotaUsage": QuotaUsage{},
		"RegisterWorker": RegisterWorker{}, "WorkerCapabilities": WorkerCapabilities{}, "Worker": Worker{}, "WorkerList": WorkerList{},
		"CreateSnapshot": CreateSnapshot{}, "DataPlane": DataPlane{}, "Snapshot": Snapshot{}, "SnapshotList": SnapshotList{},
		"RestoreSandbox": RestoreSandbox{}, "ForkSandbox": ForkSandbox{},
		"CheckpointPolicy": CheckpointPolicy{}, "Checkpoint": Checkpoint{}, "CheckpointList": CheckpointList{}, "Recovery": Recovery{},
		"Template": Template{}, "TemplateList": TemplateList{},
		"BuildReport": BuildReport{}, "BuildEvent": BuildEvent{},
		"Network": Network{}, "EgressEvent": EgressEvent{},
		"CreateSecret": CreateSecret{}, "Secret": Secret{}, "SecretList": SecretList{}, "SecretGrants": SecretGrants{},
		"SetTimeout": SetTimeout{}, "SandboxMetrics": SandboxMetrics{}, "UsageSample": UsageSample{},
		"TeamMetrics": TeamMetrics{}, "TeamMetricsPoint": TeamMetricsPoint{},
		"LifecycleEvent": LifecycleEvent{}, "LifecycleEventList": LifecycleEventList{},
		"CreateWebhook": CreateWebhook{}, "UpdateWebhook": UpdateWebhook{}, "Webhook": Webhook{}, "WebhookList": WebhookList{},
		"WebhookDelivery": WebhookDelivery{}, "WebhookDeliveryList": WebhookDeliveryList{},
		"AuditEntry": AuditEntry{}, "AuditAnchor": AuditAnchor{}, "AuditList": AuditList{}, "AuditExportHead": AuditExportHead{},
	}
	doc := loadSpec(t)
	schemas, _ := doc["components"].(map[string]any)["schemas"].(map[string]any)
	var names []string
	for name := range schemas {
		names = append(names, name)
	}
	var typeNames []string
	for name := range types {
		typeNames = append(typeNames, name)
	}
	slices.Sort(names)
	slices.Sort(typeNames)
	if diff := cmp.Diff(typeNames, names); diff != "" {
		t.Errorf("component schemas differ from the Go types (-types +schemas):\n%s", diff)
	}
	for name, v := range types {
		s, _ := schemas[name].(map[string]any)
		props, _ := s["properties"].(map[string]any)
		var got []string
		for p := range props {
			got = append(got, p)
		}
		slices.Sort(got)
		if diff := cmp.Diff(jsonFields(reflect.TypeOf(v)), got); diff != "" {
			t.Errorf("schema %s properties differ from api.%s (-go +yaml):\n%s", name, name, diff)
		}
	}
}

func jsonFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "-" && f.IsExported() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestRoutes checks Routes parses the document; the control plane's test
// compares them with the routes it serves.
func TestRoutes(t *testing.T) {
	got, err := Routes()
	if err != nil {
		t.Fatalf("Routes() = %v", err)
	}
	if len(got) < 20 || !slices.IsSortedFunc(got, func(a, b Route) int {
		return strings.Compare(a.Path+" "+a.Method, b.Path+" "+b.Method)
	}) {
		t.Errorf("Routes() = %v, want the documented routes sorted by path", got)
	}
	if got, want := (Route{"GET", "/v1/health"}).String(), "GET /v1/health"; got != want {
		t.Errorf("Route.String() = %q, want %q", got, want)
	}
}
