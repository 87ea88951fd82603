package helmchart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"space/internal/chunkstore/chunkloc"
)

// TestS3Chunks checks chunkStore.type s3 gives every replica and worker
// the same --chunks URL, one the binaries parse to the values' bucket,
// and the credentials from the Secret in the environment (never in the
// args), and mounts no chunk volume.
func TestS3Chunks(t *testing.T) {
	r := render(t, ciValues(t, "s3-chunks"))
	d := must[*appsv1.Deployment](t, r, "prod-space-server")
	ds := must[*appsv1.DaemonSet](t, r, "prod-space-worker")
	want := chunkloc.Location{S3: &chunkloc.S3{
		Bucket: "space-chunks", Prefix: "prod", Endpoint: "objects.storage.svc:8333", TLS: false, Region: "eu-west-1",
	}}
	var urls []string
	for what, spec := range map[string]corev1.PodSpec{"server": d.Spec.Template.Spec, "worker": ds.Spec.Template.Spec} {
		c := container(t, spec, what)
		u := mustFlag(t, c.Args, "chunks")
		urls = append(urls, u)
		got, err := chunkloc.Parse(u)
		if err != nil {
			t.Errorf("%s --chunks=%s: %v", what, u, err)
		} else if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s --chunks=%s parses to (-want +got):\n%s", what, u, diff)
		}
		for name, key := range map[string]string{"SPACE_S3_ACCESS_KEY": "access-key", "SPACE_S3_SECRET_KEY": "secret-key"} {
			e, _ := env(c, name)
			if e.ValueFrom == nil || !cmp.Equal(e.ValueFrom.SecretKeyRef,
				&corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "space-s3"}, Key: key}) {
				t.Errorf("%s %s = %+v, want space-s3's %s", what, name, e, key)
			}
		}
		for _, v := range spec.Volumes {
			if v.Name == "chunks" {
				t.Errorf("%s has a chunks volume %+v with an S3 store", what, v)
			}
		}
	}
	if urls[0] != urls[1] {
		t.Errorf("server and worker --chunks differ: %q", urls)
	}

	// The defaults: https, no region, the bucket's root.
	r = render(t, map[string]any{"chunkStore": map[string]any{"type": "s3", "s3": map[string]any{
		"endpoint": "s3.example.com", "bucket": "snaps", "existingSecret": "s3-creds"}}})
	u := mustFlag(t, container(t, must[*appsv1.DaemonSet](t, r, "prod-space-worker").Spec.Template.Spec, "worker").Args, "chunks")
	if got, err := chunkloc.Parse(u); err != nil || !cmp.Equal(got, chunkloc.Location{S3: &chunkloc.S3{Bucket: "snaps", Endpoint: "s3.example.com", TLS: true}}) {
		t.Errorf("--chunks=%s parses to %+v, %v; want https to s3.example.com, bucket snaps", u, got, err)
	}
	if notes := r.Notes; strings.Contains(notes, "chunk store is local") {
		t.Errorf("NOTES.txt says the S3 chunk store is local:\n%s", notes)
	}
}

// TestS3ChunksPurgeLeavesBucket checks the uninstall's purge jobs with an
// S3 store pass neither --chunks nor --remove-chunks (the bucket is
// shared) and mount no chunk volume.
func TestS3ChunksPurgeLeavesBucket(t *testing.T) {
	c := newCluster(node("vm-1", map[string]string{"space/vm-host": "true"}))
	r, err := RenderWithLookup(loadChart(t), ciValues(t, "s3-chunks"), rel, c)
	if err != nil {
		t.Fatalf("RenderWithLookup: %v", err)
	}
	n := 0
	for _, o := range r.Objects {
		j, ok := o.(*batchv1.Job)
		if !ok {
			continue
		}
		n++
		spec := j.Spec.Template.Spec
		args := spec.Containers[0].Args
		if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--chunks") || a == "--remove-chunks" }) {
			t.Errorf("purge job %s args %q: want no --chunks or --remove-chunks with an S3 store", j.Name, args)
		}
		for _, v := range spec.Volumes {
			if v.Name == "chunks" {
				t.Errorf("purge job %s mounts chunks %+v", j.Name, v)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d purge jobs, want 1", n)
	}
}
