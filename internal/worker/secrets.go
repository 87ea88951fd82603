package worker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/egress"
	"space/internal/errkind"
)

var placeholderRE = regexp.MustCompile(`^SPACE_SECRET_[A-Za-z0-9_]{16,96}$`)

func checkGrants(spec Spec) error {
	if len(spec.Secrets) == 0 {
		return nil
	}
	if spec.Network == nil {
		return fmt.Errorf("secrets need a network (the gateway adds them): %w", errkind.InvalidArgument)
	}
	seen := map[string]bool{}
	for _, g := range spec.Secrets {
		switch {
		case g.Name == "" || seen[g.Name]:
			return fmt.Errorf("secret %q granted twice or unnamed: %w", g.Name, errkind.InvalidArgument)
		case !placeholderRE.MatchString(g.Placeholder):
			return fmt.Errorf("secret %s: placeholder %q: %w", g.Name, g.Placeholder, errkind.InvalidArgument)
		case len(g.Hosts) == 0:
			return fmt.Errorf("secret %s: no hosts: %w", g.Name, errkind.InvalidArgument)
		}
		seen[g.Name] = true
	}
	return nil
}

// sealValues seals the granted secrets' values (from a create) with the
// worker's key for the sandbox's record: they must survive a worker
// restart, but never lie on disk in the clear.
func (w *Worker) sealValues(id string, spec Spec, values map[string][]byte) (map[string][]byte, error) {
	if len(spec.Secrets) == 0 {
		return nil, nil
	}
	if w.cfg.Secrets == nil {
		return nil, fmt.Errorf("this worker keeps no secrets (no key): %w", errkind.FailedPrecondition)
	}
	out := map[string][]byte{}
	for _, g := range spec.Secrets {
		v, ok := values[g.Name]
		if !ok || len(v) == 0 {
			return nil, fmt.Errorf("secret %s granted without its value: %w", g.Name, errkind.InvalidArgument)
		}
		out[g.Name] = w.cfg.Secrets.Seal(id, g.Name, v)
	}
	return out, nil
}

// policySecrets opens the sandbox's sealed secrets for its gateway.
func (w *Worker) policySecrets(s *sbx) ([]egress.Secret, error) {
	s.mu.Lock()
	id, grants, sealed := s.rec.ID, s.rec.Spec.Secrets, s.rec.Secrets
	s.mu.Unlock()
	var out []egress.Secret
	for _, g := range grants {
		if w.cfg.Secrets == nil {
			return nil, fmt.Errorf("this worker keeps no secrets (no key): %w", errkind.FailedPrecondition)
		}
		v, err := w.cfg.Secrets.Open(id, g.Name, sealed[g.Name])
		if err != nil {
			return nil, err
		}
		out = append(out, egress.Secret{Name: g.Name, Placeholder: g.Placeholder, Value: v, Hosts: g.Hosts, Header: g.Header, Format: g.Format})
	}
	return out, nil
}

// caValidity is how long a sandbox's CA is valid.
const caValidity = 90 * 24 * time.Hour

// sandboxCA returns the sandbox's CA, making it on first use. Its key is
// sealed with the worker's key in the sandbox's directory; a fork or
// restore gets a CA of its own (a new sandbox has a new directory).
func (w *Worker) sandboxCA(s *sbx) (*egress.CA, error) {
	if w.cfg.Secrets == nil {
		return nil, fmt.Errorf("this worker keeps no secrets (no key): %w", errkind.FailedPrecondition)
	}
	id := s.id()
	certPath, keyPath := filepath.Join(s.dir, "egress-ca.pem"), filepath.Join(s.dir, "egress-ca.key")
	certPEM, err := os.ReadFile(certPath)
	if err == nil {
		sealed, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, err
		}
		der, err := w.cfg.Secrets.Open(id, "egress-ca", sealed)
		if err != nil {
			return nil, err
		}
		block, _ := pem.Decode(certPEM)
		if block == nil {
			return nil, fmt.Errorf("%s: no certificate: %w", certPath, errkind.Internal)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		key, err := x509.ParseECPrivateKey(der)
		if err != nil {
			return nil, err
		}
		return &egress.CA{Cert: cert, Key: key}, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ca, err := egress.NewCA("SPACE sandbox "+id, caValidity)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(ca.Key.(*ecdsa.PrivateKey))
	if err != nil {
		return nil, err
	}
	if err := writeFileSync(keyPath, w.cfg.Secrets.Seal(id, "egress-ca", der), 0o600); err != nil {
		return nil, err
	}
	if err := writeFileSync(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// resealCA seals s's CA key, sealed for sandbox from, for sandbox to: a
// pool member handed over to a create keeps its CA (its guest trusts
// it) under its new identity. A member without a CA has nothing to do.
func (w *Worker) resealCA(s *sbx, from, to string) error {
	keyPath := filepath.Join(s.dir, "egress-ca.key")
	sealed, err := os.ReadFile(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	der, err := w.cfg.Secrets.Open(from, "egress-ca", sealed)
	if err != nil {
		return err
	}
	return writeFileSync(keyPath, w.cfg.Secrets.Seal(to, "egress-ca", der), 0o600)
}

func writeFileSync(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Where the guest finds its CA and placeholders.
const (
	guestCAFile     = "/etc/space/egress-ca.pem"
	guestBundle     = "/etc/ssl/certs/ca-certificates.crt"
	guestBundleOrig = "/etc/ssl/certs/ca-certificates.crt.space-orig"
	guestSecretsDir = "/etc/space/secrets"
)

// installCA gives the guest the sandbox's CA: as a file, and appended to
// a copy of the image's system bundle (the image's root is read-only;
// the copy lives in the writable layer and is rebuilt after every boot
// and restore, so a fork trusts its own CA, not its parent's). What is
// rebuilt every time is written without the guest's fsyncs (they cost
// tens of milliseconds each under TCG, on every create).
func installCA(ctx context.Context, a *client.Client, ca *egress.CA, grants []SecretGrant) error {
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	if err := writeRebuilt(ctx, a, guestCAFile, caPEM); err != nil {
		return err
	}
	var orig strings.Builder
	if _, err := a.ReadFile(ctx, guestBundleOrig, &orig); err != nil {
		orig.Reset()
		if _, err := a.ReadFile(ctx, guestBundle, &orig); err != nil && errkind.Of(err) != errkind.NotFound {
			return fmt.Errorf("read the guest's CA bundle: %w", err)
		}
		if err := writeGuest(ctx, a, guestBundleOrig, []byte(orig.String()), 0o644); err != nil {
			return err
		}
	}
	if err := writeRebuilt(ctx, a, guestBundle, append([]byte(orig.String()), caPEM...)); err != nil {
		return err
	}
	for _, g := range grants {
		if err := writeRebuilt(ctx, a, guestSecretsDir+"/"+g.Name, []byte(g.Placeholder)); err != nil {
			return err
		}
	}
	return nil
}

// writeRebuilt writes a file of the guest's that is written again after
// every boot and restore, so need not survive a guest crash: without
// fsyncs, unless the agent predates that (it refuses the field).
func writeRebuilt(ctx context.Context, a *client.Client, path string, b []byte) error {
	_, err := a.WriteFile(ctx, proto.WriteArgs{Path: path, Mode: 0o644, MkdirAll: true, NoSync: true}, bytes.NewReader(b))
	if err != nil && ctx.Err() == nil {
		return writeGuest(ctx, a, path, b, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write %s in the guest: %w", path, err)
	}
	return nil
}

// secretEnv is what a sandbox with a network (and so a CA) adds to every
// exec's environment: the bundle for runtimes that ignore the system
// store, and each secret's placeholder under its name (upper case, other
// characters as '_').
func secretEnv(spec Spec) map[string]string {
	if spec.Network == nil {
		return nil
	}
	env := map[string]string{
		"SSL_CERT_FILE": guestBundle, "REQUESTS_CA_BUNDLE": guestBundle, "CURL_CA_BUNDLE": guestBundle,
		"NODE_EXTRA_CA_CERTS": guestCAFile,
	}
	grants := append([]SecretGrant(nil), spec.Secrets...)
	sort.Slice(grants, func(i, j int) bool { return grants[i].Name < grants[j].Name })
	for _, g := range grants {
		env[envName(g.Name)] = g.Placeholder
	}
	return env
}

func envName(name string) string {
	b := []byte(strings.ToUpper(name))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		b = append([]byte("_"), b...)
	}
	return string(b)
}

func writeGuest(ctx context.Context, a *client.Client, path string, b []byte, mode uint32) error {
	if _, err := a.WriteFile(ctx, proto.WriteArgs{Path: path, Mode: mode, MkdirAll: true}, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("write %s in the guest: %w", path, err)
	}
	return nil
}
