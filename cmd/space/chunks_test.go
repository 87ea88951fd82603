package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"space/internal/testenv/weedtest"
)

// TestChunksFlag checks --chunks of space server and space worker takes
// an s3:// URL with the credentials from the environment (SPACE_S3_*, or
// AWS_*), against a real S3 server: a bad URL, refused credentials or a
// missing bucket fail the start with an error that says so, and nothing
// is made in the data dir.
func TestChunksFlag(t *testing.T) {
	srv := weedtest.Start(t)
	url := fmt.Sprintf("s3://%s/space?endpoint=%s&tls=false", srv.Bucket, srv.Endpoint)
	good := map[string]string{"SPACE_S3_ACCESS_KEY": srv.AccessKey, "SPACE_S3_SECRET_KEY": srv.SecretKey}
	tests := []struct {
		name   string
		chunks string
		extra  []string
		env    map[string]string
		says   string
	}{
		{"no endpoint", "s3://" + srv.Bucket, nil, good, "endpoint is required"},
		{"credentials in the URL", fmt.Sprintf("s3://k:s@%s?endpoint=%s", srv.Bucket, srv.Endpoint), nil, good, "credentials do not go in the URL"},
		{"wrong aws secret", url, nil, map[string]string{"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}, "access denied"},
		{"wrong space secret", url, nil, map[string]string{"SPACE_S3_ACCESS_KEY": srv.AccessKey, "SPACE_S3_SECRET_KEY": "wrong-secret"}, "access denied"},
		{"missing bucket", fmt.Sprintf("s3://%s-none?endpoint=%s&tls=false", srv.Bucket, srv.Endpoint), nil, good, "no such bucket"},
		{"anonymous", url, nil, nil, "access denied"},
		// Right credentials get past the check to the missing bucket.
		{"aws credentials", fmt.Sprintf("s3://%s-none?endpoint=%s&tls=false", srv.Bucket, srv.Endpoint), nil,
			map[string]string{"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey}, "no such bucket"},
		{"negative cache", url, []string{"--chunk-cache-mib", "-1"}, good, "cache size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, verb := range [][]string{
				{"server", "--no-worker", "--listen", "127.0.0.1:0"},
				{"worker", "--control-plane", "http://127.0.0.1:1", "--token", "t", "--listen", "127.0.0.1:0"},
			} {
				g, _, _ := newTestGlobals(t, tt.env)
				args := append(append(verb, "--vmm", "fake", "--chunks", tt.chunks), tt.extra...)
				_, err := run(t.Context(), g, args)
				if err == nil || !strings.Contains(err.Error(), tt.says) {
					t.Errorf("space %s = %v, want an error saying %q", verb[0], err, tt.says)
				}
				if err != nil && strings.Contains(err.Error(), "wrong-secret") {
					t.Errorf("space %s error shows the secret: %v", verb[0], err)
				}
				if entries, _ := os.ReadDir(g.dataDir); len(entries) > 0 {
					t.Errorf("space %s failed but made %d entries in the data dir", verb[0], len(entries))
				}
			}
		})
	}
}
