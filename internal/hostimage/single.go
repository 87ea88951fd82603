package hostimage

import (
	"archive/tar"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"space/internal/errkind"
)

// WriteBinaryArchive writes to the new file dst a one-layer linux/amd64
// image named ref ("localhost/pause:1") that holds only the static binary
// bin, at /<base name of bin>, as its entrypoint. The archive has the
// format Build writes, which `ctr images import` loads. Test tiers use it
// for tiny images (a pause container, a test server) without a registry.
//
// Errors wrap [errkind.InvalidArgument] for a bad ref and
// [errkind.FailedPrecondition] for a binary that is not static; dst is
// not left behind on failure.
func WriteBinaryArchive(ctx context.Context, bin, ref, dst string) error {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q: %v: %w", ref, err, errkind.InvalidArgument)
	}
	if err := checkStatic(bin); err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(dst), ".work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	epoch := time.Unix(0, 0).UTC()
	entry := filepath.Base(bin)
	layer, err := writeLayer(filepath.Join(work, "layer.tar.gz"), func(tw *tar.Writer) error {
		return addFiles(tw, []file{{src: bin, dst: entry, mode: 0o755}}, epoch)
	})
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	img, err := assemble(imageSpec{
		layers: []layerSpec{{layer: layer, createdBy: "space WriteBinaryArchive " + entry}},
		config: v1.Config{Entrypoint: []string{"/" + entry}},
	}, epoch)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := writeArchive(ctx, img, ref, tag.TagStr(), dst, epoch); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return nil
}
