package storetest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/store"
)

func newSecret(team, name string) store.Secret {
	return store.Secret{TeamID: team, Name: name, Sealed: []byte("sealed:" + team + "/" + name),
		Hosts: []string{"api.example.com"}}
}

func mustSecret(t *testing.T, s store.Store, sc store.Secret) store.Secret {
	t.Helper()
	got, err := s.CreateSecret(t.Context(), sc)
	if err != nil {
		t.Fatalf("setup: CreateSecret(%s, %s): %v", sc.TeamID, sc.Name, err)
	}
	return got
}

// listed is sc as ListSecrets returns it: without its sealed value.
func listed(sc store.Secret) store.Secret {
	sc.Sealed = nil
	return sc
}

// secretNames names each secret.
func secretNames(scs []store.Secret) []string {
	var names []string
	for _, sc := range scs {
		names = append(names, sc.Name)
	}
	return names
}

func testSecretCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")

	in := newSecret("t1", "github")
	in.Sealed = []byte{0, 1, 2, 0xff} // binary, kept byte for byte
	in.Hosts = []string{"api.github.com", "uploads.github.com"}
	in.Header, in.Format = "Authorization", "Bearer {}"
	created, err := s.CreateSecret(ctx, in)
	if err != nil {
		t.Fatalf("CreateSecret() = %v", err)
	}
	want := in
	want.Created, want.Updated = created.Created, created.Created
	if diff := cmp.Diff(want, created); diff != "" {
		t.Errorf("CreateSecret() (-want +got):\n%s", diff)
	}
	if created.Created.IsZero() || !created.Updated.Equal(created.Created) {
		t.Errorf("CreateSecret() = created %v, updated %v; want created == updated != zero", created.Created, created.Updated)
	}
	// The store keeps its own copies of the caller's slices.
	in.Sealed[0], in.Hosts[0] = 9, "evil.example"
	created.Sealed[1], created.Hosts[1] = 9, "evil.example"

	want.Sealed, want.Hosts = []byte{0, 1, 2, 0xff}, []string{"api.github.com", "uploads.github.com"}
	got, err := s.Secret(ctx, "t1", "github")
	if err != nil {
		t.Fatalf("Secret(github) = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Secret(github) after create (-want +got):\n%s", diff)
	}
	list, err := s.ListSecrets(ctx, "t1")
	if err != nil {
		t.Fatalf("ListSecrets() = %v", err)
	}
	if diff := cmp.Diff([]store.Secret{listed(want)}, list); diff != "" {
		t.Errorf("ListSecrets() (-want +got):\n%s", diff)
	}

	// A taken name, even with other fields, is refused and left as it was.
	dup := newSecret("t1", "github")
	_, err = s.CreateSecret(ctx, dup)
	wantKind(t, "CreateSecret(taken name)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.CreateSecret(ctx, newSecret("nosuch", "github"))
	wantKind(t, "CreateSecret(unknown team)", err, store.ErrNotFound, errkind.NotFound)
	if got, err := s.Secret(ctx, "t1", "github"); err != nil || !bytes.Equal(got.Sealed, want.Sealed) {
		t.Errorf("Secret(github) after a refused duplicate = %x, %v; want %x", got.Sealed, err, want.Sealed)
	}

	_, err = s.Secret(ctx, "t1", "gitlab")
	wantKind(t, "Secret(missing)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSecret(ctx, "t1", "gitlab")
	wantKind(t, "DeleteSecret(missing)", err, store.ErrNotFound, errkind.NotFound)

	if err := s.DeleteSecret(ctx, "t1", "github"); err != nil {
		t.Fatalf("DeleteSecret(github) = %v", err)
	}
	_, err = s.Secret(ctx, "t1", "github")
	wantKind(t, "Secret(deleted)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSecret(ctx, "t1", "github")
	wantKind(t, "DeleteSecret(deleted)", err, store.ErrNotFound, errkind.NotFound)
	if list, err := s.ListSecrets(ctx, "t1"); err != nil || len(list) != 0 {
		t.Errorf("ListSecrets() after delete = %v, %v; want none", secretNames(list), err)
	}
	// The name is free again.
	mustSecret(t, s, newSecret("t1", "github"))
}

func testSecretTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "a")
	mustTeam(t, s, "b")
	sc := mustSecret(t, s, newSecret("a", "token"))

	_, err := s.Secret(ctx, "b", "token")
	wantKind(t, "Secret(other team)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSecret(ctx, "b", "token")
	wantKind(t, "DeleteSecret(other team)", err, store.ErrNotFound, errkind.NotFound)
	if list, err := s.ListSecrets(ctx, "b"); err != nil || len(list) != 0 {
		t.Errorf("ListSecrets(b) = %v, %v; want none", secretNames(list), err)
	}
	// Team b's own secret of the same name is another record.
	own := mustSecret(t, s, newSecret("b", "token"))
	if err := s.DeleteSecret(ctx, "b", "token"); err != nil {
		t.Fatalf("DeleteSecret(b, token) = %v", err)
	}

	got, err := s.Secret(ctx, "a", "token")
	if err != nil {
		t.Fatalf("Secret(a, token) = %v", err)
	}
	if diff := cmp.Diff(sc, got); diff != "" {
		t.Errorf("Secret(a, token) after team b's create and delete of %s (-want +got):\n%s", own.Name, diff)
	}
}

func testSecretList(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	long := strings.Repeat("n", 64)
	for _, name := range []string{"beta", "alpha", "Zeta", long, "a.b", "a-b", "A_B"} {
		mustSecret(t, s, newSecret("t1", name))
	}
	mustSecret(t, s, newSecret("t2", "aaa"))
	list, err := s.ListSecrets(ctx, "t1")
	if err != nil {
		t.Fatalf("ListSecrets(t1) = %v", err)
	}
	// Bytewise by name: '-' < '.' < upper case < '_' < lower case.
	want := []string{"A_B", "Zeta", "a-b", "a.b", "alpha", "beta", long}
	if diff := cmp.Diff(want, secretNames(list)); diff != "" {
		t.Errorf("ListSecrets(t1) (-want +got):\n%s", diff)
	}
	for _, sc := range list {
		if sc.Sealed != nil || sc.TeamID != "t1" || len(sc.Hosts) != 1 {
			t.Errorf("ListSecrets(t1) has %+v, want a t1 record with its hosts and no sealed value", sc)
		}
	}
}

func testSecretPersistence(t *testing.T, h Harness) {
	ctx := t.Context()
	loc := h.New(t)
	s, err := h.Open(ctx, loc)
	if err != nil {
		t.Fatalf("setup: open: %v", err)
	}
	mustTeam(t, s, "t1")
	in := newSecret("t1", "keep")
	in.Sealed = bytes.Repeat([]byte{0xa5}, store.MaxSealedSecret)
	in.Hosts = []string{"a.example", "b.example"}
	in.Header, in.Format = "X-Api-Key", "{}"
	keep := mustSecret(t, s, in)
	mustSecret(t, s, newSecret("t1", "gone"))
	if err := s.DeleteSecret(ctx, "t1", "gone"); err != nil {
		t.Fatalf("DeleteSecret(gone) = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}

	s = open(t, h, loc)
	got, err := s.Secret(ctx, "t1", "keep")
	if err != nil {
		t.Fatalf("Secret(keep) after reopen = %v", err)
	}
	if diff := cmp.Diff(keep, got); diff != "" {
		t.Errorf("Secret(keep) after reopen (-want +got):\n%s", diff)
	}
	list, err := s.ListSecrets(ctx, "t1")
	if err != nil {
		t.Fatalf("ListSecrets() after reopen = %v", err)
	}
	if diff := cmp.Diff([]store.Secret{listed(keep)}, list); diff != "" {
		t.Errorf("ListSecrets() after reopen (-want +got):\n%s", diff)
	}
}

func testSecretBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	existing := mustSecret(t, s, newSecret("t1", "keep"))
	hosts := func(n int) []string {
		var hs []string
		for i := range n {
			hs = append(hs, strings.Repeat("h", i+1)+".example")
		}
		return hs
	}
	bad := []struct {
		name string
		f    func(*store.Secret)
	}{
		{"empty team", func(sc *store.Secret) { sc.TeamID = "" }},
		{"team with slash", func(sc *store.Secret) { sc.TeamID = "a/b" }},
		{"empty name", func(sc *store.Secret) { sc.Name = "" }},
		{"name with slash", func(sc *store.Secret) { sc.Name = "a/b" }},
		{"name with space", func(sc *store.Secret) { sc.Name = "a b" }},
		{"name too long", func(sc *store.Secret) { sc.Name = strings.Repeat("n", 65) }},
		{"nil sealed", func(sc *store.Secret) { sc.Sealed = nil }},
		{"empty sealed", func(sc *store.Secret) { sc.Sealed = []byte{} }},
		{"sealed too large", func(sc *store.Secret) { sc.Sealed = make([]byte, store.MaxSealedSecret+1) }},
		{"no hosts", func(sc *store.Secret) { sc.Hosts = nil }},
		{"17 hosts", func(sc *store.Secret) { sc.Hosts = hosts(17) }},
		{"empty host", func(sc *store.Secret) { sc.Hosts = []string{"a.example", ""} }},
		{"upper case host", func(sc *store.Secret) { sc.Hosts = []string{"API.example"} }},
		{"host with port", func(sc *store.Secret) { sc.Hosts = []string{"a.example:443"} }},
		{"host too long", func(sc *store.Secret) { sc.Hosts = []string{strings.Repeat("h", 254)} }},
		{"header too long", func(sc *store.Secret) { sc.Header = strings.Repeat("X", 257) }},
		{"format too long", func(sc *store.Secret) { sc.Format = "{}" + strings.Repeat("f", 1<<10-1) }},
	}
	type op struct {
		name string
		fn   func() error
	}
	var tests []op
	for _, b := range bad {
		tests = append(tests, op{"create " + b.name, func() error {
			sc := newSecret("t1", "new")
			b.f(&sc)
			_, err := s.CreateSecret(ctx, sc)
			return err
		}})
	}
	tests = append(tests, []op{
		{"get empty name", func() error { _, err := s.Secret(ctx, "t1", ""); return err }},
		{"get name with slash", func() error { _, err := s.Secret(ctx, "t1", "keep/x"); return err }},
		{"get name too long", func() error { _, err := s.Secret(ctx, "t1", strings.Repeat("n", 65)); return err }},
		{"delete empty name", func() error { return s.DeleteSecret(ctx, "t1", "") }},
		{"delete name with slash", func() error { return s.DeleteSecret(ctx, "t1", "keep/x") }},
	}...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantKind(t, tt.name, tt.fn(), store.ErrInvalid, errkind.InvalidArgument)
		})
	}
	// The limits themselves are fine.
	ok := newSecret("t1", strings.Repeat("n", 64))
	ok.Sealed = make([]byte, store.MaxSealedSecret)
	ok.Hosts = hosts(16)
	ok.Header, ok.Format = strings.Repeat("X", 256), "{}"+strings.Repeat("f", 1<<10-2)
	mustSecret(t, s, ok)

	list, err := s.ListSecrets(ctx, "t1")
	if err != nil {
		t.Fatalf("ListSecrets() = %v", err)
	}
	if diff := cmp.Diff([]string{"keep", ok.Name}, secretNames(list)); diff != "" {
		t.Errorf("ListSecrets() after bad input (-want +got):\n%s", diff)
	}
	if got, err := s.Secret(ctx, "t1", "keep"); err != nil {
		t.Errorf("Secret(keep) after bad input = %v", err)
	} else if diff := cmp.Diff(existing, got); diff != "" {
		t.Errorf("Secret(keep) after bad input (-want +got):\n%s", diff)
	}
}
