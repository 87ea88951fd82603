package server

import (
	"net/http"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/testenv"
)

// TestSandboxMetrics: GET /v1/sandboxes/{id}/metrics serves the usage
// history the worker's heartbeat keeps, for the sandbox's own team only,
// and refuses a malformed range.
func TestSandboxMetrics(t *testing.T) {
	ts := startFakeServerWith(t, Config{AgentHeartbeat: 100 * time.Millisecond, AgentTimeout: time.Second})
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 256})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	var m api.SandboxMetrics
	testenv.Eventually(t, 30*time.Second, func() bool {
		m, err = c.Metrics(ctx, sb.ID, time.Time{}, time.Time{})
		return err == nil && len(m.Samples) >= 2
	})
	if m.SandboxID != sb.ID || m.IntervalSeconds != 0.1 {
		t.Errorf("metrics = %+v, want sandbox %s at 0.1 s", m, sb.ID)
	}
	if got, err := c.Metrics(ctx, sb.ID, time.Unix(0, 0), time.Unix(1, 0)); err != nil || len(got.Samples) != 0 {
		t.Errorf("metrics of 1970 = %d samples, %v; want none", len(got.Samples), err)
	}
	for _, q := range []string{"start=yesterday", "end=-5", "start=2000&end=1000"} {
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.url+"/v1/sandboxes/"+sb.ID+"/metrics?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+ts.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("metrics?%s = %d, want 400", q, resp.StatusCode)
		}
	}
	k, err := c.CreateAPIKey(ctx, api.CreateAPIKey{Name: "other", Team: "other"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := client.New(ts.url, k.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Metrics(ctx, sb.ID, time.Time{}, time.Time{}); !client.IsNotFound(err) {
		t.Errorf("another team's metrics = %v, want not found", err)
	}
}
