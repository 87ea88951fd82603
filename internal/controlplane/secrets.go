package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"

	"space/api"
	"space/internal/egress"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/worker"
)

// Bounds of a secret.
const (
	maxSecretValue  = 64 << 10 // bytes
	maxSecretHosts  = 16
	maxSecretHeader = 256  // bytes
	maxSecretFormat = 1024 // bytes
)

// reservedHeaders are the headers HTTP itself manages: a secret sent in
// one would break the request or smuggle another.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Upgrade": true, "Expect": true,
}

// secretView is what the API shows of a secret: never its value.
func secretView(sc store.Secret) api.Secret {
	return api.Secret{Name: sc.Name, Hosts: sc.Hosts, Header: sc.Header, Format: sc.Format, CreatedAt: sc.Created}
}

// errNoSecrets answers the secret routes of a server without a key.
var errNoSecrets = fmt.Errorf("this server keeps no secrets (it was started without a secrets key): %w", errkind.FailedPrecondition)

func (s *Server) handleCreateSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		httpapi.WriteError(w, errNoSecrets)
		return
	}
	var req api.CreateSecret
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := checkSecret(&req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	team := callerOf(r).team
	sc, err := s.cfg.Store.CreateSecret(r.Context(), store.Secret{
		TeamID: team, Name: req.Name, Sealed: s.cfg.Secrets.Seal(team, req.Name, req.Value),
		Hosts: req.Hosts, Header: req.Header, Format: req.Format,
	})
	if errors.Is(err, store.ErrAlreadyExists) {
		err = &httpapi.FieldError{Field: "name", Err: fmt.Errorf("your team has a secret %s already (delete it first to replace it): %w", req.Name, errkind.Conflict)}
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	noteCreated(r.Context(), sc.Name)
	httpapi.WriteJSON(w, http.StatusCreated, secretView(sc))
}

// checkSecret checks req, naming the offending field, and normalizes it:
// the header name in canonical form, the format "{}" when a header has
// none.
func checkSecret(req *api.CreateSecret) error {
	if !store.ValidSecretName(req.Name) {
		return httpapi.Invalid("name", "%.80q: want 1-64 characters of [A-Za-z0-9_.-]", req.Name)
	}
	if len(req.Value) == 0 || len(req.Value) > maxSecretValue {
		return httpapi.Invalid("value", "%d bytes, want 1 byte to 64 KiB", len(req.Value))
	}
	if len(req.Hosts) == 0 || len(req.Hosts) > maxSecretHosts {
		return httpapi.Invalid("hosts", "%d hosts, want 1 to %d host names the secret may be sent to", len(req.Hosts), maxSecretHosts)
	}
	seen := map[string]bool{}
	for _, h := range req.Hosts {
		if err := checkSecretHost(h); err != nil {
			return err
		}
		if seen[h] {
			return httpapi.Invalid("hosts", "%q is listed twice", h)
		}
		seen[h] = true
	}
	if req.Header == "" {
		if req.Format != "" {
			return httpapi.Invalid("format", "given without a header: the format is the header's value")
		}
		return nil
	}
	if len(req.Header) > maxSecretHeader || !validHeaderName(req.Header) {
		return httpapi.Invalid("header", "%.80q is not an HTTP header name", req.Header)
	}
	req.Header = textproto.CanonicalMIMEHeaderKey(req.Header)
	if reservedHeaders[req.Header] {
		return httpapi.Invalid("header", "%s is managed by HTTP itself; a secret cannot be sent in it", req.Header)
	}
	if req.Format == "" {
		req.Format = "{}"
	}
	switch {
	case len(req.Format) > maxSecretFormat:
		return httpapi.Invalid("format", "longer than %d bytes", maxSecretFormat)
	case strings.Count(req.Format, "{}") != 1:
		return httpapi.Invalid("format", "%.80q: want \"{}\" exactly once, where the value goes (e.g. \"Bearer {}\")", req.Format)
	case controlChar(req.Format) >= 0:
		return httpapi.Invalid("format", "%.80q holds a control character, which a header value may not", req.Format)
	}
	if i := controlChar(string(req.Value)); i >= 0 {
		// Never quote the value: name the offending byte only.
		return httpapi.Invalid("value", "byte %d is control character %#02x, which a value sent in a header may not hold (a trailing newline from the file?)", i, req.Value[i])
	}
	return nil
}

// checkSecretHost checks that h is an exact host name as an egress rule
// writes it: lower case, no trailing dot, no wildcard, port or address.
func checkSecretHost(h string) error {
	r, err := egress.ParseRule(h)
	if err != nil || r.Host != h || r.Port != 0 || strings.HasPrefix(h, "*.") {
		return httpapi.Invalid("hosts", "%.100q: want an exact lower-case host name (no wildcard, port or address)", h)
	}
	return nil
}

// validHeaderName reports whether s is an HTTP field name: a token of
// RFC 9110 (tchar).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// controlChar returns the index of the first control character in s other
// than tab (which header values may hold), or -1.
func controlChar(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return i
		}
	}
	return -1
}

func (s *Server) handleListSecrets(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		httpapi.WriteError(w, errNoSecrets)
		return
	}
	all, err := s.cfg.Store.ListSecrets(r.Context(), callerOf(r).team)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	out := api.SecretList{Secrets: make([]api.Secret, 0, len(all))}
	for _, sc := range all {
		out.Secrets = append(out.Secrets, secretView(sc))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		httpapi.WriteError(w, errNoSecrets)
		return
	}
	name := r.PathValue("name")
	if !store.ValidSecretName(name) {
		httpapi.WriteError(w, fmt.Errorf("secret %.80q: %w", name, store.ErrNotFound))
		return
	}
	if err := s.cfg.Store.DeleteSecret(r.Context(), callerOf(r).team, name); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// maxGrants bounds the secrets one sandbox is granted.
const maxGrants = 32

// grants turns a create's secret names into grants, each with a fresh
// placeholder: the only thing of the secret the sandbox will see.
func (s *Server) grants(ctx context.Context, team string, names []string) ([]worker.SecretGrant, error) {
	if s.cfg.Secrets == nil {
		return nil, fmt.Errorf("this server keeps no secrets: %w", errkind.FailedPrecondition)
	}
	if len(names) > maxGrants {
		return nil, httpapi.Invalid("secrets", "more than %d", maxGrants)
	}
	var out []worker.SecretGrant
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			return nil, httpapi.Invalid("secrets", "%.64q granted twice", n)
		}
		seen[n] = true
		sc, err := s.cfg.Store.Secret(ctx, team, n)
		if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalid) {
			return nil, httpapi.Invalid("secrets", "no secret %.64q (space secret ls lists yours)", n)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, worker.SecretGrant{Name: sc.Name, Placeholder: newPlaceholder(),
			Hosts: sc.Hosts, Header: sc.Header, Format: sc.Format})
	}
	return out, nil
}

// secretValues opens the values of a sandbox's granted secrets for its
// worker. A secret deleted since the grant fails the create.
func (s *Server) secretValues(ctx context.Context, team string, grants []worker.SecretGrant) (map[string][]byte, error) {
	if len(grants) == 0 {
		return nil, nil
	}
	if s.cfg.Secrets == nil {
		return nil, fmt.Errorf("this server keeps no secrets: %w", errkind.FailedPrecondition)
	}
	out := map[string][]byte{}
	for _, g := range grants {
		sc, err := s.cfg.Store.Secret(ctx, team, g.Name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("secret %s granted to the sandbox no longer exists: %w", g.Name, errkind.FailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		v, err := s.cfg.Secrets.Open(team, g.Name, sc.Sealed)
		if err != nil {
			return nil, err
		}
		out[g.Name] = v
	}
	return out, nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// allowGrantHosts returns n with the hosts of grants allowed on port 443
// ("host:443"), each one that no rule of n allows there already. This is
// how a grant reaches its hosts: the worker's gateway enforces the
// policy exactly as the record shows it, adds nothing of its own, and
// never adds a secret to a connection the policy refuses. The user sees
// the rules and may remove them (the grant then stays, inert for that
// host).
func allowGrantHosts(n worker.Network, grants []worker.SecretGrant) worker.Network {
	rules, _ := egress.ParseRules(n.Allow) // n is checked; a bad one fails its Policy
	allow := append([]string(nil), n.Allow...)
	for _, g := range grants {
		for _, h := range g.Hosts {
			if !allowsOn443(rules, h) {
				r := egress.Rule{Host: h, Port: 443}
				rules = append(rules, r)
				allow = append(allow, r.String())
			}
		}
	}
	n.Allow = allow
	return n
}

// allowsOn443 reports whether a rule allows host name on port 443.
func allowsOn443(rules []egress.Rule, name string) bool {
	for _, r := range rules {
		if r.Port != 0 && r.Port != 443 {
			continue
		}
		if suffix, ok := strings.CutPrefix(r.Host, "*."); ok && strings.HasSuffix(name, "."+suffix) || r.Host == name {
			return true
		}
	}
	return false
}

// handleSetSecrets replaces a running sandbox's grants with the team's
// secrets the body names. A grant kept keeps its placeholder; a new one
// gets a fresh placeholder and, as at create, its hosts in the policy
// (allowGrantHosts); a dropped one leaves the policy as it is. The worker
// applies it, then the record keeps it: nothing changes on an error.
func (s *Server) handleSetSecrets(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		httpapi.WriteError(w, errNoSecrets)
		return
	}
	var b api.SecretGrants
	if err := httpapi.DecodeJSON(r, &b); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := checkGrantNames(b.Secrets); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	sb, wk, err := s.running(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	sp, err := specOf(sb)
	switch {
	case err != nil:
		httpapi.WriteError(w, err)
		return
	case sb.State != sandbox.Running:
		httpapi.WriteError(w, fmt.Errorf("sandbox %s is %s (its guest gets the placeholders): %w", sb.ID, sb.State, errkind.FailedPrecondition))
		return
	case sp.Network == nil:
		httpapi.WriteError(w, fmt.Errorf("sandbox %s has no network interface, so no gateway to add secrets: %w", sb.ID, errkind.FailedPrecondition))
		return
	}
	ctx, release, err := s.claim(context.WithoutCancel(r.Context()), sb.ID)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	defer release()
	grants, added, err := s.regrant(ctx, sb.TeamID, sp.Secrets, b.Secrets)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	n := allowGrantHosts(*sp.Network, added)
	if _, err := n.Policy(); err != nil {
		httpapi.WriteError(w, &httpapi.FieldError{Field: "secrets", Err: err})
		return
	}
	values, err := s.secretValues(ctx, sb.TeamID, grants)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if _, err := wk.SetSecrets(ctx, sb.ID, worker.SecretsRequest{Secrets: grants, Network: n, SecretValues: values}); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	updated, err := s.updateSpec(ctx, sb, func(sp *spec) { sp.Secrets, sp.Network = grants, &n })
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("sandbox secrets set", "sandbox_id", sb.ID, "secrets", len(grants))
	s.writeView(w, http.StatusOK, updated)
}

// checkGrantNames checks the secret names of a PUT .../secrets.
func checkGrantNames(names []string) error {
	if names == nil {
		return httpapi.Invalid("secrets", "required: every secret the sandbox is to have ([] for none)")
	}
	if len(names) > maxGrants {
		return httpapi.Invalid("secrets", "more than %d", maxGrants)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if !store.ValidSecretName(n) {
			return httpapi.Invalid("secrets", "%.80q: want 1-64 characters of [A-Za-z0-9_.-]", n)
		}
		if seen[n] {
			return httpapi.Invalid("secrets", "%.64q named twice", n)
		}
		seen[n] = true
	}
	return nil
}

// regrant turns a sandbox's current grants and the names of its new ones
// into its new grants, with the secrets' hosts, header and format as
// stored now; a grant kept keeps its placeholder (the guest's copies stay
// good). added are the new grants among them. A name the team has no
// secret of is NotFound.
func (s *Server) regrant(ctx context.Context, team string, current []worker.SecretGrant, names []string) (grants, added []worker.SecretGrant, err error) {
	had := map[string]string{}
	for _, g := range current {
		had[g.Name] = g.Placeholder
	}
	for _, n := range names {
		sc, err := s.cfg.Store.Secret(ctx, team, n)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil, fmt.Errorf("no secret %s in your team (space secret ls lists yours): %w", n, errkind.NotFound)
		}
		if err != nil {
			return nil, nil, err
		}
		g := worker.SecretGrant{Name: sc.Name, Placeholder: had[n], Hosts: sc.Hosts, Header: sc.Header, Format: sc.Format}
		if g.Placeholder == "" {
			g.Placeholder = newPlaceholder()
			added = append(added, g)
		}
		grants = append(grants, g)
	}
	return grants, added, nil
}

// newPlaceholder returns a fresh placeholder: the only thing of a secret
// a sandbox sees.
func newPlaceholder() string {
	return "SPACE_SECRET_" + strings.ToUpper(hex.EncodeToString(randomBytes(16)))
}
