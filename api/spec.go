package api

import (
	"cmp"
	_ "embed"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// OpenAPI is the OpenAPI 3 document (YAML) describing this API.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Route is one operation of the API: an HTTP method and a path template
// as the OpenAPI document writes it, e.g. {"GET", "/v1/sandboxes/{id}"}.
// Method is upper case.
type Route struct {
	Method string
	Path   string
}

// String returns the route as a net/http ServeMux pattern, e.g.
// "GET /v1/sandboxes/{id}".
func (r Route) String() string { return r.Method + " " + r.Path }

// openAPIMethods are the operation keys of an OpenAPI path item.
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// Routes returns every operation in [OpenAPI], sorted by path and then
// method.
func Routes() ([]Route, error) {
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(OpenAPI, &doc); err != nil {
		return nil, fmt.Errorf("parse openapi.yaml: %w", err)
	}
	var routes []Route
	for path, item := range doc.Paths {
		for key := range item {
			if slices.Contains(openAPIMethods, key) {
				routes = append(routes, Route{Method: strings.ToUpper(key), Path: path})
			}
		}
	}
	slices.SortFunc(routes, func(a, b Route) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Method, b.Method))
	})
	return routes, nil
}
