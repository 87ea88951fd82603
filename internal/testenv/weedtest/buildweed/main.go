// Command buildweed builds SeaweedFS's weed binary, which the s3 test tier
// runs, into the shared tool cache (once per version) and prints its path.
// scripts/build-weed.sh runs it.
//
// Usage: buildweed [-version v]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"space/internal/cachedir"
	"space/internal/testenv/weedtest"
)

func main() {
	version := flag.String("version", weedtest.Version, "SeaweedFS module version")
	flag.Parse()
	base := cachedir.DefaultBase(nil)
	if base == "" {
		fmt.Fprintln(os.Stderr, "buildweed: no cache directory: set SPACE_CACHE_DIR")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	p, err := weedtest.Build(ctx, base, *version, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildweed: %v\n", err)
		os.Exit(1)
	}
	if fi, err := os.Stat(p); err == nil && time.Since(start) > 5*time.Second {
		fmt.Fprintf(os.Stderr, "buildweed: weed %s ready after %v, %d MiB\n", *version, time.Since(start).Round(time.Second), fi.Size()>>20)
	}
	fmt.Println(p)
}
