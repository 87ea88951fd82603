package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"space/api"
	"space/client"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/templatebuild"
	"space/internal/templatespec"
	"space/internal/worker"
)

// templateMeta is what the store keeps as a template version's Meta.
type templateMeta struct {
	// Spec is what its sandboxes run with: the base image, resources and
	// exec defaults.
	Spec   worker.Spec      `json:"spec"`
	Start  []string         `json:"start,omitempty"`
	Report *api.BuildReport `json:"report,omitempty"`
	Error  string           `json:"error,omitempty"`
}

// buildTTL bounds a build sandbox's life: one left behind by a crash
// expires.
const buildTTL = 6 * time.Hour

// maxTemplateName bounds a template's name.
const maxTemplateName = 64

func validTemplateName(n string) bool {
	return store.ValidTemplateName(n)
}

// templateRef is a sandbox's template as the store and API show it.
func templateRef(name string, version int) string { return name + ":" + strconv.Itoa(version) }

// parseTemplateRef splits "name" or "name:version" (version 0: the latest
// ready one).
func parseTemplateRef(ref string) (name string, version int, err error) {
	name, v, hasVersion := strings.Cut(ref, ":")
	if hasVersion {
		if version, err = strconv.Atoi(v); err != nil || version < 1 {
			return "", 0, httpapi.Invalid("template", "%.64q: the version after ':' is a number from 1", ref)
		}
	}
	if !validTemplateName(name) {
		return "", 0, httpapi.Invalid("template", "%.64q is not a template name", ref)
	}
	return name, version, nil
}

// templateView is the API's picture of a template version. One whose
// metadata does not decode is shown without what only the metadata says
// (with an error saying so), and the error is returned for the caller to
// report.
func (s *Server) templateView(t store.Template) (api.Template, error) {
	m, err := templateMetaOf(t)
	if err != nil {
		m.Error = "its stored metadata does not decode; delete it and build again"
	}
	return api.Template{
		Name: t.Name, Version: t.Version, State: string(t.State), Image: m.Spec.Template, Snapshot: t.SnapshotID,
		VCPUs: m.Spec.VCPUs, MemoryMiB: m.Spec.MemoryMiB, DiskMiB: m.Spec.DiskMiB, Env: m.Spec.Env,
		Workdir: m.Spec.Workdir, User: m.Spec.User, Start: m.Start, Report: m.Report, Error: m.Error, CreatedAt: t.Created,
	}, err
}

// templateViews pictures every version in all; one whose metadata does
// not decode is listed all the same, and logged.
func (s *Server) templateViews(out []api.Template, all []store.Template) []api.Template {
	for _, t := range all {
		v, err := s.templateView(t)
		if err != nil {
			s.log.Error("list templates: record does not decode", "template", templateRef(t.Name, t.Version), "team", t.TeamID, "err", err)
		}
		out = append(out, v)
	}
	return out
}

// setTemplateState records t in state to (checked against the one
// table), applying edit, with compare-and-set on its version.
func (s *Server) setTemplateState(ctx context.Context, t store.Template, to store.TemplateState, edit func(*store.Template)) (store.Template, error) {
	if err := store.CheckTemplate(t.State, to); err != nil {
		return t, fmt.Errorf("template %s: %w", templateRef(t.Name, t.Version), err)
	}
	t.State = to
	if edit != nil {
		edit(&t)
	}
	return s.writes(ctx).UpdateTemplate(ctx, t)
}

// builtinViews are the server's own templates (the default first).
func (s *Server) builtinViews() []api.Template {
	l := s.cfg.Limits
	var out []api.Template
	for i, n := range s.cfg.Templates {
		out = append(out, api.Template{Name: n, State: string(store.TemplateReady), Default: i == 0,
			VCPUs: l.DefaultVCPUs, MemoryMiB: l.DefaultMemoryMiB, DiskMiB: l.DefaultDiskMiB})
	}
	return out
}

func (s *Server) handleListTemplates(w http.ResponseWriter, r *http.Request) {
	all, err := s.cfg.Store.ListTemplates(r.Context(), callerOf(r).team, "")
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.TemplateList{Templates: s.templateViews(s.builtinViews(), all)}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetTemplate(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("name")
	for _, b := range s.builtinViews() {
		if b.Name == ref {
			httpapi.WriteJSON(w, http.StatusOK, api.TemplateList{Templates: []api.Template{b}})
			return
		}
	}
	name, version, err := parseTemplateRef(ref)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var all []store.Template
	if version > 0 {
		var t store.Template
		t, err = s.cfg.Store.Template(r.Context(), callerOf(r).team, name, version)
		all = []store.Template{t}
	} else {
		all, err = s.cfg.Store.ListTemplates(r.Context(), callerOf(r).team, name)
		if err == nil && len(all) == 0 {
			err = fmt.Errorf("template %s: %w", name, store.ErrNotFound)
		}
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.TemplateList{Templates: s.templateViews([]api.Template{}, all)}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handleDeleteTemplate removes a version ("name:version") or every
// version ("name") of a template, refusing while sandboxes run from it.
func (s *Server) handleDeleteTemplate(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	ref := r.PathValue("name")
	if slices.Contains(s.cfg.Templates, ref) {
		httpapi.WriteError(w, fmt.Errorf("template %s is built in: %w", ref, errkind.FailedPrecondition))
		return
	}
	name, version, err := parseTemplateRef(ref)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	ctx := context.WithoutCancel(r.Context())
	all, err := s.cfg.Store.ListTemplates(ctx, c.team, name)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	all = slices.DeleteFunc(all, func(t store.Template) bool { return version != 0 && t.Version != version })
	if len(all) == 0 {
		httpapi.WriteError(w, fmt.Errorf("template %s: %w", ref, store.ErrNotFound))
		return
	}
	sbs, err := s.cfg.Store.ListSandboxes(ctx, c.team, store.Filter{})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	for _, t := range all {
		if t.State == store.TemplateBuilding {
			httpapi.WriteError(w, fmt.Errorf("template %s is being built: %w", templateRef(t.Name, t.Version), errkind.Conflict))
			return
		}
		for _, sb := range sbs {
			if live(sb.State) && sb.Template == templateRef(t.Name, t.Version) {
				httpapi.WriteError(w, fmt.Errorf("template %s is in use by sandbox %s (and maybe others); delete them first: %w",
					sb.Template, sb.ID, errkind.Conflict))
				return
			}
		}
	}
	for _, t := range all {
		if err := s.deleteTemplate(ctx, t); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteTemplate removes a template version, and its snapshot unless
// something else (another version, a cached build step) still uses it.
// Its whole build's cache entry goes too: building the same spec again
// then runs its last steps again rather than bringing the version back.
func (s *Server) deleteTemplate(ctx context.Context, t store.Template) error {
	if t.State != store.TemplateDeleting {
		var err error
		if t, err = s.setTemplateState(ctx, t, store.TemplateDeleting, nil); err != nil {
			return err
		}
	}
	if t.Key != "" {
		if err := s.cfg.Store.DeleteBuildCache(ctx, t.TeamID, t.Key); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	if err := s.cfg.Store.DeleteTemplate(ctx, t.TeamID, t.Name, t.Version); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if t.SnapshotID != "" {
		s.dropUnusedSnapshot(ctx, t.TeamID, t.SnapshotID)
	}
	s.log.Info("template deleted", "template", templateRef(t.Name, t.Version), "team", t.TeamID)
	return nil
}

// dropUnusedSnapshot deletes a build's snapshot once no template version
// or cache entry refers to it. Failures are logged: the snapshot stays
// listed and can be removed by hand.
func (s *Server) dropUnusedSnapshot(ctx context.Context, team, id string) {
	inUse, err := s.cfg.Store.SnapshotInUse(ctx, team, id)
	if err != nil || inUse {
		return
	}
	sn, err := s.cfg.Store.Snapshot(ctx, team, id)
	if err == nil {
		err = s.deleteSnapshot(ctx, sn)
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("remove a template's snapshot", "snapshot_id", id, "err", err)
	}
}

// fromTemplate resolves a create's template ref to the spec and placement
// of a sandbox restored from the template's warm snapshot.
func (s *Server) fromTemplate(ctx context.Context, team, ref string, b createBody) (spec, placement, error) {
	name, version, err := parseTemplateRef(ref)
	if err != nil {
		return spec{}, placement{}, err
	}
	t, err := s.cfg.Store.Template(ctx, team, name, version)
	if errors.Is(err, store.ErrNotFound) {
		what := "no ready version"
		if version > 0 {
			what = "no version " + strconv.Itoa(version)
		}
		return spec{}, placement{}, httpapi.Invalid("template", "template %s has %s (have %s, or a template of yours)", name, what, strings.Join(s.cfg.Templates, ", "))
	}
	if err != nil {
		return spec{}, placement{}, err
	}
	if t.State != store.TemplateReady {
		return spec{}, placement{}, &httpapi.FieldError{Field: "template", Err: fmt.Errorf("template %s is %s: %w", templateRef(t.Name, t.Version), t.State, errkind.FailedPrecondition)}
	}
	m, err := templateMetaOf(t)
	if err != nil {
		return spec{}, placement{}, err
	}
	switch {
	case b.ColdBoot:
		return spec{}, placement{}, httpapi.Invalid("cold_boot", "sandboxes of a built template start from its warm snapshot; cold boot is for the built-in templates")
	case b.VCPUs != nil && *b.VCPUs != m.Spec.VCPUs, b.MemoryMiB != nil && *b.MemoryMiB != m.Spec.MemoryMiB, b.DiskMiB != nil && *b.DiskMiB != m.Spec.DiskMiB:
		return spec{}, placement{}, httpapi.Invalid("template", "template %s was captured with %d vcpus, %d MiB of memory and %d MiB of disk; its sandboxes have those (set resources in the template's spec)",
			templateRef(t.Name, t.Version), m.Spec.VCPUs, m.Spec.MemoryMiB, m.Spec.DiskMiB)
	}
	sn, err := s.cfg.Store.Snapshot(ctx, team, t.SnapshotID)
	if err != nil {
		return spec{}, placement{}, fmt.Errorf("template %s: snapshot %s: %w", ref, t.SnapshotID, err)
	}
	pl, err := s.snapshotPlacement(sn)
	if err != nil {
		return spec{}, placement{}, err
	}
	sp := spec{Spec: m.Spec, TemplateRef: templateRef(t.Name, t.Version)}
	// The template's snapshot has a network interface: its sandboxes get
	// the create's policy, or one that allows nothing.
	sp.Network = &worker.Network{}
	if b.Network != nil {
		sp.Network = workerNetwork(*b.Network)
		if _, err := sp.Network.Policy(); err != nil {
			return spec{}, placement{}, &httpapi.FieldError{Field: "network", Err: err}
		}
	}
	if len(b.Env) > 0 {
		sp.Env = map[string]string{}
		for k, v := range m.Spec.Env {
			sp.Env[k] = v
		}
		for k, v := range b.Env {
			sp.Env[k] = v
		}
	}
	return sp, pl, nil
}

// handleBuildTemplate builds a template from a build context (a tar
// stream holding the spec file and what it copies) and answers with the
// build's events as NDJSON, the last one "done" or "error".
func (s *Server) handleBuildTemplate(w http.ResponseWriter, r *http.Request) {
	c := callerOf(r)
	if s.cfg.Images == nil || s.cfg.BuildDir == "" {
		httpapi.WriteError(w, fmt.Errorf("this server does not build templates (no image cache): %w", errkind.FailedPrecondition))
		return
	}
	q := r.URL.Query()
	file := q.Get("file")
	if file == "" {
		file = "space.yaml"
	}
	if p := path.Clean(file); path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
		httpapi.WriteError(w, httpapi.Invalid("file", "%.64q must be a path inside the build context", file))
		return
	}
	if err := os.MkdirAll(s.cfg.BuildDir, 0o700); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	dir, err := os.MkdirTemp(s.cfg.BuildDir, "context-")
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer os.RemoveAll(dir)
	if err := extractContext(r.Body, dir); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(file)))
	if err != nil {
		httpapi.WriteError(w, httpapi.Invalid("file", "the build context has no spec file %.64q", file))
		return
	}
	sp, err := templatespec.Parse(f)
	f.Close()
	if err == nil {
		err = sp.Check()
	}
	if err != nil {
		httpapi.WriteError(w, &httpapi.FieldError{Field: "spec", Err: err})
		return
	}
	name := q.Get("name")
	if name == "" {
		name = sp.Name
	}
	switch {
	case name == "":
		httpapi.WriteError(w, httpapi.Invalid("name", "give the template a name (the spec's name field or ?name=)"))
		return
	case !validTemplateName(name):
		httpapi.WriteError(w, httpapi.Invalid("name", "%.64q: 1-%d characters of [A-Za-z0-9_.-]", name, maxTemplateName))
		return
	case slices.Contains(s.cfg.Templates, name):
		httpapi.WriteError(w, httpapi.Invalid("name", "%s is a built-in template", name))
		return
	}
	ctx := r.Context() // a client that goes away cancels its build
	// The version is the store's to number, so until it is known the
	// build claims the name: reconcile must not take the new version for
	// one a crash interrupted.
	_, releaseName, err := s.claim(ctx, buildNameClaim(c.team, name)+store.NewID("b"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	t, err := s.cfg.Store.CreateTemplate(ctx, store.Template{TeamID: c.team, Name: name, State: store.TemplateBuilding})
	if err != nil {
		releaseName()
		httpapi.WriteError(w, err)
		return
	}
	ctx, release, err := s.claim(ctx, buildClaim(t))
	releaseName()
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	send := func(ev api.BuildEvent) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(ev) // a client that left gets nothing more
		rc.Flush()
	}
	l := s.cfg.Limits
	res, berr := templatebuild.Build(ctx, templatebuild.Request{
		Spec: sp, ContextDir: dir, Name: name, Team: c.team,
		Defaults:  templatespec.Resources{VCPUs: l.DefaultVCPUs, MemoryMiB: l.DefaultMemoryMiB, DiskMiB: l.DefaultDiskMiB},
		Images:    s.cfg.Images,
		Sandboxes: &buildSandboxes{s: s, team: c.team, ref: templateRef(name, t.Version)},
		Cache:     teamCache{s: s, team: c.team},
		Progress:  send,
		Log:       s.log.With("template", name),
	})
	m := templateMeta{
		Spec: worker.Spec{Template: res.Image.Name, VCPUs: res.Resources.VCPUs, MemoryMiB: res.Resources.MemoryMiB,
			DiskMiB: res.Resources.DiskMiB, Env: res.Env, Workdir: res.Workdir, User: res.User},
		Start: res.Start, Report: &res.Report,
	}
	to, key, snap := store.TemplateReady, res.Key, res.SnapshotID
	if berr != nil {
		to, key, snap, m.Error = store.TemplateFailed, "", "", berr.Error()
	}
	meta, err := json.Marshal(m)
	if err == nil {
		t, err = s.setTemplateState(context.WithoutCancel(ctx), t, to, func(t *store.Template) {
			t.Key, t.SnapshotID, t.Meta = key, snap, meta
		})
	}
	if err = errors.Join(berr, err); err != nil {
		s.log.Warn("template build failed", "template", templateRef(name, t.Version), "team", c.team, "err", err)
		body := httpapi.Body(err)
		send(api.BuildEvent{Type: "error", Error: &body, Report: &res.Report})
		return
	}
	s.log.Info("template built", "template", templateRef(name, t.Version), "team", c.team,
		"executed", res.Report.Executed, "cached", res.Report.Cached, "duration_ms", res.Report.DurationMS)
	v, _ := s.templateView(t) // its metadata was just encoded
	send(api.BuildEvent{Type: "done", Template: &v, Report: &res.Report})
}

// reconcileTemplates settles the template versions a crash left being
// built or deleted: an interrupted build fails (its build sandboxes go),
// an interrupted delete finishes.
func (s *Server) reconcileTemplates(ctx context.Context, busy claimed) error {
	pending, err := s.cfg.Store.UnsettledTemplates(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range pending {
		if busy.busy(buildClaim(t)) || busy.busyPrefix(buildNameClaim(t.TeamID, t.Name)) {
			continue
		}
		if err := s.settle(ctx, buildClaim(t), func(ctx context.Context) error { return s.settleTemplate(ctx, t) }); err != nil {
			errs = append(errs, fmt.Errorf("settle template %s: %w", templateRef(t.Name, t.Version), err))
		}
	}
	return errors.Join(errs...)
}

// settleTemplate fails an interrupted build of t (its build sandboxes
// go) or finishes an interrupted delete.
func (s *Server) settleTemplate(ctx context.Context, t store.Template) error {
	ref := templateRef(t.Name, t.Version)
	s.log.Info("settling interrupted template", "template", ref, "team", t.TeamID, "state", t.State)
	if t.State == store.TemplateDeleting {
		if err := s.deleteTemplate(ctx, t); err != nil && !errors.Is(err, store.ErrVersionConflict) {
			return err
		}
		return nil
	}
	sbs, err := s.cfg.Store.ListSandboxes(ctx, t.TeamID, store.Filter{Labels: map[string]string{buildLabel: ref}})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sbs {
		if err := s.delete(ctx, sb); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, fmt.Errorf("build sandbox %s: %w", sb.ID, err))
		}
	}
	meta, err := json.Marshal(templateMeta{Error: "the build was interrupted (the server stopped); build again"})
	if err == nil {
		_, err = s.setTemplateState(ctx, t, store.TemplateFailed, func(t *store.Template) { t.Meta = meta })
	}
	if err != nil && !errors.Is(err, store.ErrVersionConflict) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// buildNameClaim starts what a build claims while its version is being
// created (see handleBuildTemplate).
func buildNameClaim(team, name string) string {
	return "template-name/" + team + "/" + name + "/"
}

// buildClaim is what a build claims (see claim) so that reconcile leaves
// its template version alone.
func buildClaim(t store.Template) string {
	return "template/" + t.TeamID + "/" + templateRef(t.Name, t.Version)
}

// teamCache is a team's build cache in the store. An entry whose snapshot
// is gone or not ready is dropped.
type teamCache struct {
	s    *Server
	team string
}

func (c teamCache) Get(ctx context.Context, key string) (string, error) {
	e, err := c.s.cfg.Store.BuildCache(ctx, c.team, key)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	sn, err := c.s.cfg.Store.Snapshot(ctx, c.team, e.SnapshotID)
	if err == nil && sn.State == store.SnapshotReady {
		return sn.ID, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	if err := c.s.cfg.Store.DeleteBuildCache(ctx, c.team, key); err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err
	}
	return "", nil
}

func (c teamCache) Put(ctx context.Context, key, snapshotID string) error {
	_, err := c.s.cfg.Store.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: c.team, Key: key, SnapshotID: snapshotID})
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil // a concurrent build of the same steps cached them first
	}
	if err == nil {
		c.s.crash("api.template.step-cached")
	}
	return err
}

// buildSandboxes starts the build sandboxes of a team's template version
// ref.
type buildSandboxes struct {
	s    *Server
	team string
	ref  string
}

// buildLabel marks a build sandbox with the template version it builds.
const buildLabel = "space.template-build"

func (b *buildSandboxes) labels() map[string]string { return map[string]string{buildLabel: b.ref} }

// Build sandboxes always have a network interface (allowing only what the
// spec's network.allow names), so that the template's snapshot has one and
// its sandboxes can be given a network.
func (b *buildSandboxes) Boot(ctx context.Context, image string, res templatespec.Resources, allow []string) (templatebuild.Sandbox, error) {
	sp := spec{Spec: worker.Spec{Template: image, VCPUs: res.VCPUs, MemoryMiB: res.MemoryMiB, DiskMiB: res.DiskMiB, ColdBoot: true,
		Network: &worker.Network{Allow: allow}},
		TimeoutSeconds: int64(buildTTL / time.Second)}
	sb, err := b.s.create(ctx, b.team, sp, b.labels(), placement{})
	if err != nil {
		return nil, err
	}
	return b.open(ctx, sb)
}

func (b *buildSandboxes) Restore(ctx context.Context, snapshotID string, allow []string) (templatebuild.Sandbox, error) {
	sn, err := b.s.cfg.Store.Snapshot(ctx, b.team, snapshotID)
	if err != nil {
		return nil, err
	}
	m, err := metaOf(sn)
	if err != nil {
		return nil, err
	}
	pl, err := b.s.snapshotPlacement(sn)
	if err != nil {
		return nil, err
	}
	sp := spec{Spec: m.Spec, TimeoutSeconds: int64(buildTTL / time.Second)}
	sp.Network = &worker.Network{Allow: allow}
	sb, err := b.s.create(ctx, b.team, sp, b.labels(), pl)
	if err != nil {
		return nil, err
	}
	return b.open(ctx, sb)
}

func (b *buildSandboxes) open(ctx context.Context, sb store.Sandbox) (templatebuild.Sandbox, error) {
	wk, err := b.s.worker(sb.WorkerID)
	if err == nil {
		var c *client.Client
		c, err = client.New("http://worker.invalid", "", client.WithHTTPClient(&http.Client{Transport: workerTransport{wk}}))
		if err == nil {
			return &buildSandbox{s: b.s, sb: sb, wk: wk, c: c}, nil
		}
	}
	return nil, errors.Join(err, b.s.delete(context.WithoutCancel(ctx), sb))
}

// buildSandbox is a running build sandbox, reached through its worker's
// data plane.
type buildSandbox struct {
	s  *Server
	sb store.Sandbox
	wk Worker
	c  *client.Client
}

// Exec runs a build step over the NDJSON exec route: the in-process
// transport to the worker cannot hand over a connection for a WebSocket.
func (b *buildSandbox) Exec(ctx context.Context, req api.Exec, stdout, stderr io.Writer) (api.Exit, error) {
	return b.c.ExecEvents(ctx, b.sb.ID, req, stdout, stderr)
}

func (b *buildSandbox) Start(ctx context.Context, req api.Exec) error {
	_, err := b.c.StartDetached(ctx, b.sb.ID, req)
	return err
}

func (b *buildSandbox) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) error {
	_, err := b.c.WriteFile(ctx, b.sb.ID, p, r, client.WriteOptions{Mode: mode, Mkdir: true})
	return err
}

func (b *buildSandbox) RemoveFile(ctx context.Context, p string) error {
	return b.c.RemoveFile(ctx, b.sb.ID, p, client.RemoveOptions{})
}

func (b *buildSandbox) PortOpen(ctx context.Context, port int) (bool, error) {
	return b.c.PortOpen(ctx, b.sb.ID, port)
}

func (b *buildSandbox) Snapshot(ctx context.Context, name string) (string, error) {
	sb, err := b.s.cfg.Store.Sandbox(ctx, b.sb.TeamID, b.sb.ID)
	if err != nil {
		return "", err
	}
	if sb.State != sandbox.Running {
		return "", fmt.Errorf("build sandbox %s is %s: %w", sb.ID, sb.State, errkind.FailedPrecondition)
	}
	sn, err := b.s.snapshot(ctx, sb, b.wk, name)
	return sn.ID, err
}

func (b *buildSandbox) Delete(ctx context.Context) error {
	sb, err := b.s.cfg.Store.Sandbox(ctx, b.sb.TeamID, b.sb.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return b.s.delete(ctx, sb)
}
