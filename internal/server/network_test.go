package server

import (
	"bytes"
	"crypto/rand"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/egress/egresstest"
	"space/internal/testenv"
)

// TestSandboxNetwork runs a sandbox with a network behind its gateway
// against an HTTPS upstream in a namespace of the test's own: the allowed
// name works from the guest's own tools; other names, raw addresses,
// other resolvers and forged answers fail; a policy change applies to new
// connections; a fork keeps the policy with an address of its own; every
// decision is in the egress log.
func TestSandboxNetwork(t *testing.T) {
	u := egresstest.Start(t)
	nsPath, caPEM := u.Netns, u.CAPEM
	up := []netip.Addr{egresstest.Addr}
	ts := startServerWith(t, Config{Egress: Egress{Netns: nsPath, Roots: u.Pool, Hosts: map[string][]netip.Addr{
		"api.test": up, "other.test": up,
		"loop.test": {netip.MustParseAddr("127.0.0.1")}, "meta.test": {netip.MustParseAddr("169.254.169.254")},
	}}})
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, Network: &api.Network{Allow: []string{"api.test", "loop.test", "meta.test"}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/ca.pem", strings.NewReader(string(caPEM)), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The guest's own tools trust its sandbox's CA (the gateway
	// terminates HTTPS); -f makes a refusal (421, 403) a failure.
	curl := func(id, args string) (string, int) {
		out, errOut, code := execOut(t, c, id, sh("curl -sS -f --max-time 10 "+args))
		return out + errOut, code
	}
	if out, code := curl(sb.ID, "https://api.test/"); code != 0 || out != "hello api.test" {
		t.Errorf("curl https://api.test/ = %q (exit %d)", out, code)
	}
	if out, code := curl(sb.ID, "http://api.test/plain"); code != 0 || out != "hello api.test" {
		t.Errorf("curl http://api.test/plain = %q (exit %d)", out, code)
	}
	for what, args := range map[string]string{
		"an unlisted name":           "https://other.test/",
		"the upstream by IP":         "--connect-timeout 5 http://" + egresstest.Addr.String() + "/",
		"a name leading to loopback": "http://loop.test/",
		"a name leading to metadata": "http://meta.test/",
	} {
		if out, code := curl(sb.ID, args); code == 0 {
			t.Errorf("%s: curl %s = %q, want a failure", what, args, out)
		}
	}
	// A forged answer: other.test at api.test's address.
	apiAddr, _, _ := execOut(t, c, sb.ID, sh("getent hosts api.test | cut -d' ' -f1"))
	apiAddr = strings.TrimSpace(apiAddr)
	if out, code := curl(sb.ID, "--resolve other.test:443:"+apiAddr+" https://other.test/"); code == 0 {
		t.Errorf("other.test through api.test's address (%s) = %q, want a failure", apiAddr, out)
	}
	// Another resolver: no answer ever comes back.
	const py = `import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
q=bytes.fromhex("123401000001000000000000056f7468657204746573740000010001")
s.sendto(q, ("8.8.8.8", 53))
try:
    s.recv(512); print("answered")
except OSError as e:
    print("no answer")`
	if out, _, _ := execOut(t, c, sb.ID, api.Exec{Command: []string{"python3", "-c", py}}); strings.TrimSpace(out) != "no answer" {
		t.Errorf("DNS to 8.8.8.8 from the guest: %q", out)
	}

	// ICMP out, IPv6, a CONNECT through the allowed host and a Host that
	// disagrees with the name all fail.
	if out, errOut, _ := execOut(t, c, sb.ID, pingFrom("8.8.8.8")); strings.TrimSpace(out) != "no answer" {
		t.Errorf("ping 8.8.8.8 from the guest: %q %q", out, errOut)
	}
	if out, _, code := execOut(t, c, sb.ID, api.Exec{Command: []string{"python3", "-c",
		`import socket; socket.create_connection(("2001:db8::10", 443), timeout=3)`}}); code == 0 {
		t.Errorf("an IPv6 connection from the guest succeeded: %q", out)
	}
	for what, args := range map[string]string{
		"CONNECT to other.test through api.test": "-p -x http://api.test:80 https://other.test/",
		"Host other.test to api.test":            "-H 'Host: other.test' http://api.test/",
	} {
		if out, code := curl(sb.ID, args); code == 0 {
			t.Errorf("%s = %q, want a failure", what, out)
		}
	}

	// A policy change applies to new connections.
	if _, err := c.SetNetwork(ctx, sb.ID, api.Network{Allow: []string{"other.test"}}); err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	if out, code := curl(sb.ID, "https://other.test/"); code != 0 || out != "hello other.test" {
		t.Errorf("after allowing other.test: %q (exit %d)", out, code)
	}
	if out, code := curl(sb.ID, "https://api.test/"); code == 0 {
		t.Errorf("after dropping api.test: %q, want a failure", out)
	}

	// A fork keeps the policy, with an address of its own.
	addrOf := func(id string) string {
		out, _, _ := execOut(t, c, id, api.Exec{Command: []string{"python3", "-c",
			`import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("203.0.113.1", 9)); print(s.getsockname()[0])`}})
		return strings.TrimSpace(out)
	}
	kids, err := c.ForkSandbox(ctx, sb.ID, 1)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if a, b := addrOf(sb.ID), addrOf(kids[0].ID); a == "" || a == b {
		t.Errorf("parent at %q, fork at %q: want addresses of their own", a, b)
	}
	if kids[0].Network == nil || strings.Join(kids[0].Network.Allow, ",") != "other.test" {
		t.Errorf("fork's network = %+v, want the parent's policy", kids[0].Network)
	}
	if out, code := curl(kids[0].ID, "https://other.test/"); code != 0 || out != "hello other.test" {
		t.Errorf("fork: curl https://other.test/ = %q (exit %d)", out, code)
	}

	// A sandbox created without a policy restores the warm template with
	// a NIC whose gateway allows nothing, until its policy changes.
	plain, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if plain.VM == nil || plain.VM.StartedBy == "boot" || plain.Network == nil || len(plain.Network.Allow) != 0 {
		t.Errorf("a sandbox without a policy: started by %+v, network %+v; want a restore and a network allowing nothing", plain.VM, plain.Network)
	}
	if _, err := c.WriteFile(ctx, plain.ID, "/tmp/ca.pem", strings.NewReader(string(caPEM)), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, code := curl(plain.ID, "https://api.test/"); code == 0 {
		t.Errorf("a sandbox without a policy reached api.test: %q", out)
	}
	if _, err := c.SetNetwork(ctx, plain.ID, api.Network{Allow: []string{"api.test"}}); err != nil {
		t.Fatalf("SetNetwork on a sandbox created without a policy: %v", err)
	}
	if out, code := curl(plain.ID, "https://api.test/"); code != 0 || out != "hello api.test" {
		t.Errorf("after allowing api.test: %q (exit %d)", out, code)
	}
	// Pings, once allowed, reach what the rules allow on every port: an
	// address rule's address, and an allowed name (its synthetic address).
	apiIP, _, _ := execOut(t, c, plain.ID, sh("getent hosts api.test | cut -d' ' -f1"))
	apiIP = strings.TrimSpace(apiIP)
	if out, _, _ := execOut(t, c, plain.ID, pingFrom(apiIP)); strings.TrimSpace(out) != "no answer" {
		t.Errorf("ping api.test (%s) without ICMP allowed: %q", apiIP, out)
	}
	v6 := "http://[" + egresstest.Addr6.String() + "]/"
	if out, code := curl(plain.ID, "-g --connect-timeout 5 "+v6); code == 0 {
		t.Errorf("%s with no IPv6 rule: %q, want a failure", v6, out)
	}
	if _, err := c.SetNetwork(ctx, plain.ID, api.Network{Allow: []string{"api.test", egresstest.Addr.String(),
		"[" + egresstest.Addr6.String() + "]:80"}, ICMP: true}); err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	// IPv6 by address, on the port its rule names only.
	if out, code := curl(plain.ID, "-g "+v6); code != 0 || out != "hello ["+egresstest.Addr6.String()+"]" {
		t.Errorf("curl %s with its rule: %q (exit %d)", v6, out, code)
	}
	if out, code := curl(plain.ID, "-g --connect-timeout 5 https://["+egresstest.Addr6.String()+"]/"); code == 0 {
		t.Errorf("IPv6 on a port its rule does not name: %q, want a failure", out)
	}
	for what, target := range map[string]string{"api.test": apiIP, "an allowed address": egresstest.Addr.String(), "8.8.8.8": "8.8.8.8"} {
		want := "answered"
		if target == "8.8.8.8" {
			want = "no answer"
		}
		if out, errOut, _ := execOut(t, c, plain.ID, pingFrom(target)); strings.TrimSpace(out) != want {
			t.Errorf("ping %s (%s) with ICMP allowed: %q %q, want %s", what, target, out, errOut, want)
		}
	}

	// A port exposed through the API: a server in the guest answers an
	// authenticated request from outside; without the key, nothing.
	if _, err := c.StartDetached(ctx, sb.ID, api.Exec{Command: []string{"python3", "-m", "http.server", "8000", "--directory", "/tmp"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { open, _ := c.PortOpen(ctx, sb.ID, 8000); return open })
	exposed := ts.url + "/v1/sandboxes/" + sb.ID + "/ports/8000/http/ca.pem"
	for key, want := range map[string]int{ts.key: http.StatusOK, "": http.StatusUnauthorized} {
		req, _ := http.NewRequestWithContext(ctx, "GET", exposed, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", exposed, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == http.StatusOK && string(body) != string(caPEM) {
			t.Errorf("GET the exposed port (key %t) = %d %.80q, want %d", key != "", resp.StatusCode, body, want)
		}
		if fromGuest := resp.Header.Get("Space-Port") == "8000"; fromGuest != (want == http.StatusOK) {
			t.Errorf("GET the exposed port (key %t): Space-Port %q: the header marks the guest's answers only", key != "", resp.Header.Get("Space-Port"))
		}
	}
	// The guest's own 404 is marked as the guest's; a port nothing
	// listens on is SPACE's 503, unmarked.
	for path, want := range map[string]string{"/ports/8000/http/no-such-file": "8000", "/ports/8001/http/": ""} {
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.url+"/v1/sandboxes/"+sb.ID+path, nil)
		req.Header.Set("Authorization", "Bearer "+ts.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Space-Port"); got != want || resp.StatusCode/100 != 4 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("GET %s = %d with Space-Port %q, want an error marked %q", path, resp.StatusCode, got, want)
		}
	}

	events, err := c.EgressLog(ctx, sb.ID)
	if err != nil {
		t.Fatalf("EgressLog: %v", err)
	}
	var allowedAPI, deniedDNS, deniedIP bool
	for _, e := range events {
		allowedAPI = allowedAPI || e.Allowed && e.Proto == "tcp" && e.Name == "api.test" && e.BytesIn > 0
		deniedDNS = deniedDNS || !e.Allowed && e.Proto == "dns" && e.Name == "other.test"
		deniedIP = deniedIP || !e.Allowed && e.Proto == "tcp" && e.Addr == egresstest.Addr.String()
	}
	if !allowedAPI || !deniedDNS || !deniedIP {
		t.Errorf("egress log lacks a decision (allowed api.test %v, denied DNS other.test %v, denied raw IP %v): %+v",
			allowedAPI, deniedDNS, deniedIP, events)
	}

	// The log outlives the sandbox's runs: a suspend and resume keeps the
	// earlier run's decisions before the new ones, and a deleted
	// sandbox's log is still there.
	apiFetches := func(id string) int {
		t.Helper()
		events, err := c.EgressLog(ctx, id)
		if err != nil {
			t.Fatalf("EgressLog(%s): %v", id, err)
		}
		n := 0
		for _, e := range events {
			if e.Allowed && e.Proto == "tcp" && e.Name == "api.test" {
				n++
			}
		}
		return n
	}
	before := apiFetches(plain.ID)
	if _, err := c.SuspendSandbox(ctx, plain.ID); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if n := apiFetches(plain.ID); n != before {
		t.Errorf("egress log of the suspended sandbox: %d fetches of api.test, want %d", n, before)
	}
	if _, err := c.ResumeSandbox(ctx, plain.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if out, code := curl(plain.ID, "https://api.test/"); code != 0 || out != "hello api.test" {
		t.Errorf("after the resume: curl https://api.test/ = %q (exit %d)", out, code)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return apiFetches(plain.ID) == before+1 })
	if err := c.DeleteSandbox(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	if n := apiFetches(plain.ID); n != before+1 {
		t.Errorf("egress log of the deleted sandbox: %d fetches of api.test, want %d", n, before+1)
	}
	var ce *client.Error
	if _, err := c.EgressLog(ctx, "sbx_"+strings.Repeat("a", 20)); !asClientError(err, &ce) || ce.Status != http.StatusNotFound {
		t.Errorf("EgressLog(a sandbox never seen) = %v, want not found", err)
	}
}

// TestSandboxSecret grants a sandbox a secret bound to api.test: a real
// VM's curl sends its placeholder, the upstream gets the value from the
// gateway (TLS terminated with the sandbox's CA, which the guest's system
// store trusts); other.test gets the placeholder; and after the request
// the value is in neither the guest's environment, its disk, nor its
// memory (the VM's own memory file), nor the worker's record.
func TestSandboxSecret(t *testing.T) {
	u := egresstest.Start(t)
	up := []netip.Addr{egresstest.Addr}
	ts := startServerWith(t, Config{Egress: Egress{Netns: u.Netns, Roots: u.Pool,
		Hosts: map[string][]netip.Addr{"api.test": up, "other.test": up}}})
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	secret := "sk-live-" + rand.Text() + rand.Text()
	if _, err := c.CreateSecret(ctx, api.CreateSecret{Name: "apikey", Value: []byte(secret), Hosts: []string{"api.test"}}); err != nil {
		t.Fatalf("CreateSecret: %v", err)
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, Secrets: []string{"apikey"},
		Network: &api.Network{Allow: []string{"other.test"}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(sb.Secrets) != 1 || sb.Secrets[0] != "apikey" {
		t.Errorf("sandbox secrets = %v", sb.Secrets)
	}
	placeholder, _, _ := execOut(t, c, sb.ID, sh("cat /etc/space/secrets/apikey"))
	if env, _, _ := execOut(t, c, sb.ID, sh(`printf %s "$APIKEY"`)); env != placeholder || !strings.HasPrefix(placeholder, "SPACE_SECRET_") {
		t.Fatalf("placeholder: file %q, $APIKEY %q", placeholder, env)
	}
	// The system store (curl's default) trusts the sandbox's CA.
	out, errOut, code := execOut(t, c, sb.ID, sh(`curl -sS --max-time 10 -H "Authorization: Bearer $APIKEY" https://api.test/v1`))
	if code != 0 || out != "hello api.test" {
		t.Fatalf("curl api.test = %q %q (exit %d)", out, errOut, code)
	}
	if out, errOut, code := execOut(t, c, sb.ID, sh(`curl -sS --max-time 10 -H "Authorization: Bearer $APIKEY" https://other.test/`)); code != 0 || out != "hello other.test" {
		t.Fatalf("curl other.test = %q %q (exit %d)", out, errOut, code)
	}
	got := u.Requests()
	if len(got) != 2 || !strings.HasPrefix(got[0].String(), "api.test /v1 Bearer "+secret) || !strings.HasPrefix(got[1].String(), "other.test / Bearer "+placeholder) {
		t.Errorf("the upstream saw %q; want the secret for api.test only", got)
	}

	// A fork has a CA of its own, trusts it, and its gateway adds the
	// secret too.
	kids, err := c.ForkSandbox(ctx, sb.ID, 1)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	parentCA, _, _ := execOut(t, c, sb.ID, sh("cat /etc/space/egress-ca.pem"))
	childCA, _, _ := execOut(t, c, kids[0].ID, sh("cat /etc/space/egress-ca.pem"))
	if parentCA == "" || parentCA == childCA {
		t.Errorf("the fork's CA is its parent's (or missing)")
	}
	if out, errOut, code := execOut(t, c, kids[0].ID, sh(`curl -sS --max-time 10 -H "Authorization: Bearer $APIKEY" https://api.test/fork`)); code != 0 || out != "hello api.test" {
		t.Errorf("curl api.test in the fork = %q %q (exit %d)", out, errOut, code)
	}
	if got := u.Requests(); !strings.HasPrefix(got[len(got)-1].String(), "api.test /fork Bearer "+secret) {
		t.Errorf("the fork's request reached the upstream as %q", got[len(got)-1])
	}
	if err := c.DeleteSandbox(ctx, kids[0].ID); err != nil {
		t.Fatal(err)
	}

	// Nowhere in the sandbox, nor in the worker's files.
	if out, _, _ := execOut(t, c, sb.ID, sh("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")); strings.Contains(out, secret) {
		t.Errorf("the secret is in the guest's environment")
	}
	// The sandbox's directory holds its disk (the writable layer) and,
	// on reflink storage, its memory file; otherwise that is in the run
	// directory. Scanned from the host: the value never enters the guest,
	// not even to look for it.
	execOut(t, c, sb.ID, sh("sync"))
	dir := filepath.Join(ts.dataDir, "worker", "sandboxes", sb.ID)
	scanned := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if found, err := fileContains(p, []byte(secret)); err != nil || found {
			t.Errorf("%s holds the secret (or cannot be read: %v)", p, err)
		}
		if d.Name() == "memory" || d.Name() == "rw.img" {
			scanned++
		}
		return nil
	})
	if run := filepath.Join("/dev/shm", "space-"+ts.workerID, sb.ID, "vm", "memory"); scanned < 2 {
		if found, err := fileContains(run, []byte(secret)); err != nil || found {
			t.Errorf("%s holds the secret (or cannot be read: %v)", run, err)
		} else {
			scanned++
		}
	}
	if scanned != 2 {
		t.Errorf("scanned %d of the VM's memory file and disk, want both", scanned)
	}
}

// TestSandboxSecretGrants changes a running sandbox's grants and policy:
// a sandbox created without secrets is granted one (its gateway, which
// had no CA, is replaced by one that has), which adds the secret's host
// to its policy and brings a placeholder that the gateway replaces; a
// policy that leaves the host out makes it unreachable and `sandbox get`
// shows so; a second grant appears in the guest (a new exec's
// environment and the file) and is replaced upstream; dropping it
// removes the file and leaves its placeholder unreplaced.
func TestSandboxSecretGrants(t *testing.T) {
	u := egresstest.Start(t)
	up := []netip.Addr{egresstest.Addr}
	ts := startServerWith(t, Config{Egress: Egress{Netns: u.Netns, Roots: u.Pool,
		Hosts: map[string][]netip.Addr{"api.test": up, "other.test": up, "x.wild.test": up}}})
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	first, second := "sk-first-"+rand.Text(), "sk-second-"+rand.Text()
	for _, sc := range []api.CreateSecret{
		{Name: "apikey", Value: []byte(first), Hosts: []string{"api.test"}},
		{Name: "second", Value: []byte(second), Hosts: []string{"x.wild.test"}},
	} {
		if _, err := c.CreateSecret(ctx, sc); err != nil {
			t.Fatalf("CreateSecret(%s): %v", sc.Name, err)
		}
	}
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256, Network: &api.Network{Allow: []string{"other.test"}}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	allow := func(what string, want ...string) {
		t.Helper()
		got, err := c.Sandbox(ctx, sb.ID)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got.Network == nil || !slices.Equal(got.Network.Allow, want) {
			t.Errorf("%s: sandbox get shows network %+v, want allow %q", what, got.Network, want)
		}
	}
	curl := func(host, path, env string, flags ...string) (string, int) {
		t.Helper()
		out, errOut, code := execOut(t, c, sb.ID, sh(`curl -sS --max-time 10 `+strings.Join(flags, " ")+
			` -H "Authorization: Bearer `+env+`" https://`+host+path))
		return out + errOut, code
	}
	lastRequest := func() string {
		got := u.Requests()
		if len(got) == 0 {
			return ""
		}
		return got[len(got)-1].String()
	}

	// Granted while running: the host is in the policy, the placeholder
	// in the guest, the value upstream.
	got, err := c.SetSecrets(ctx, sb.ID, []string{"apikey"})
	if err != nil {
		t.Fatalf("SetSecrets(apikey): %v", err)
	}
	if !slices.Equal(got.Secrets, []string{"apikey"}) || got.Network == nil || !slices.Equal(got.Network.Allow, []string{"other.test", "api.test:443"}) {
		t.Errorf("SetSecrets(apikey) = secrets %q, network %+v; want apikey and allow other.test, api.test:443", got.Secrets, got.Network)
	}
	allow("after granting apikey", "other.test", "api.test:443")
	placeholder, _, _ := execOut(t, c, sb.ID, sh("cat /etc/space/secrets/apikey"))
	if env, _, _ := execOut(t, c, sb.ID, sh(`printf %s "$APIKEY"`)); env != placeholder || !strings.HasPrefix(placeholder, "SPACE_SECRET_") {
		t.Fatalf("placeholder: file %q, $APIKEY %q", placeholder, env)
	}
	if out, code := curl("api.test", "/granted", "$APIKEY"); code != 0 || out != "hello api.test" {
		t.Fatalf("curl api.test after the grant = %q (exit %d)", out, code)
	}
	if got := lastRequest(); !strings.HasPrefix(got, "api.test /granted Bearer "+first) {
		t.Errorf("the upstream saw %q, want apikey's value", got)
	}

	// A policy without the secret's host: unreachable, and shown so.
	if _, err := c.SetNetwork(ctx, sb.ID, api.Network{Allow: []string{"other.test"}}); err != nil {
		t.Fatalf("SetNetwork: %v", err)
	}
	allow("after a policy without api.test", "other.test")
	n := len(u.Requests())
	if out, code := curl("api.test", "/refused", "$APIKEY"); code == 0 {
		t.Errorf("curl api.test after the policy left it out = %q (exit 0), want a failure", out)
	}
	if len(u.Requests()) != n {
		t.Errorf("the upstream saw %q after the policy left api.test out", lastRequest())
	}

	// A second grant: its host joins the policy (apikey's, kept, does not
	// come back); its placeholder is in new execs and the file.
	if got, err = c.SetSecrets(ctx, sb.ID, []string{"apikey", "second"}); err != nil {
		t.Fatalf("SetSecrets(apikey, second): %v", err)
	}
	if got.Network == nil || !slices.Equal(got.Network.Allow, []string{"other.test", "x.wild.test:443"}) {
		t.Errorf("SetSecrets(apikey, second) = network %+v, want allow other.test, x.wild.test:443", got.Network)
	}
	allow("after granting second", "other.test", "x.wild.test:443")
	placeholder2, _, _ := execOut(t, c, sb.ID, sh("cat /etc/space/secrets/second"))
	env, _, _ := execOut(t, c, sb.ID, sh(`printf '%s %s' "$APIKEY" "$SECOND"`))
	if env != placeholder+" "+placeholder2 || !strings.HasPrefix(placeholder2, "SPACE_SECRET_") || placeholder2 == placeholder {
		t.Fatalf("placeholders: files %q and %q, $APIKEY $SECOND %q", placeholder, placeholder2, env)
	}
	if out, code := curl("x.wild.test", "/added", "$SECOND"); code != 0 || out != "hello x.wild.test" {
		t.Fatalf("curl x.wild.test = %q (exit %d)", out, code)
	}
	if got := lastRequest(); !strings.HasPrefix(got, "x.wild.test /added Bearer "+second) {
		t.Errorf("the upstream saw %q, want second's value", got)
	}

	// Dropped: the file goes, new execs lack it, and the gateway no
	// longer replaces its placeholder (the host stays allowed).
	if got, err = c.SetSecrets(ctx, sb.ID, []string{"apikey"}); err != nil {
		t.Fatalf("SetSecrets(apikey) again: %v", err)
	}
	if !slices.Equal(got.Secrets, []string{"apikey"}) {
		t.Errorf("SetSecrets(apikey) again = secrets %q", got.Secrets)
	}
	if out, _, code := execOut(t, c, sb.ID, sh(`test -e /etc/space/secrets/second && echo file; printf %s "${SECOND-unset}"`)); code != 0 || out != "unset" {
		t.Errorf("after dropping second the guest has %q, want no file and no $SECOND", out)
	}
	if out, code := curl("x.wild.test", "/dropped", placeholder2); code != 0 || out != "hello x.wild.test" {
		t.Fatalf("curl x.wild.test after the drop = %q (exit %d)", out, code)
	}
	if got := lastRequest(); !strings.HasPrefix(got, "x.wild.test /dropped Bearer "+placeholder2) {
		t.Errorf("the upstream saw %q, want the dropped placeholder as it was sent", got)
	}
}

// fileContains reports whether the file at path holds b, reading it in
// pieces (a memory file is large).
func fileContains(path string, b []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	chunk := make([]byte, 4<<20)
	var tail []byte // the last len(b)-1 bytes read, for a match across pieces
	for {
		n, err := f.Read(chunk)
		window := append(tail, chunk[:n]...)
		if bytes.Contains(window, b) {
			return true, nil
		}
		tail = append([]byte(nil), window[max(0, len(window)-len(b)+1):]...)
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// pingFrom is an exec that sends one ICMP echo request from a raw socket
// in the guest to target and prints "answered" if target's echo reply
// comes back within 3 seconds, else "no answer".
func pingFrom(target string) api.Exec {
	const py = `import socket, struct, sys, time
target = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(3)
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b)//2), b)); t = (t >> 16) + (t & 0xffff); return ~(t + (t >> 16)) & 0xffff
p = struct.pack("!BBHHH", 8, 0, 0, 7, 1) + b"space"*4
p = p[:2] + struct.pack("!H", csum(p)) + p[4:]
s.sendto(p, (target, 0))
deadline = time.time() + 3
try:
    while True:
        s.settimeout(max(0.01, deadline - time.time()))
        data, addr = s.recvfrom(1024)
        if addr[0] == target and data[20] == 0 and data[28:] == b"space"*4:
            print("answered"); break
except OSError:
    print("no answer")`
	return api.Exec{Command: []string{"python3", "-c", py, target}}
}
