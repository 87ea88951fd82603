// Testsummary reads `go test -json` output on stdin, prints a readable log
// and a summary of passed, failed and skipped tests, and exits non-zero when
// the run must not count as green.
//
// Usage:
//
//	go test -json ./... 2>&1 | go run ./internal/testenv/testsummary
//
// The log holds the output of failing tests and packages, build errors, one
// line per skipped test and go test's per-package "ok"/"FAIL" lines. The
// summary counts tests per package and lists skipped tests by tier.
//
// It exits 1 when a test or package failed (build and setup failures, panics
// and timeouts included), a package has no final result, a skip message does
// not start with the tier gate's prefix `test tier "` (see
// [space/internal/testenv.Unavailable]), or a skip names a required tier.
// Required tiers are those listed in SPACE_TEST_TIERS (comma-separated); when
// it is unset and CI=true every tier is required, as in package testenv.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

func main() {
	rep, err := check(os.Stdin, os.Stdout, requiredTiers())
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: read test events: %v\n", err)
		os.Exit(1)
	}
	rep.print(os.Stdout)
	if len(rep.Problems) > 0 {
		os.Exit(1)
	}
}

// requiredTiers mirrors testenv's rule for which tiers must not skip.
func requiredTiers() func(tier string) bool {
	list, set := os.LookupEnv("SPACE_TEST_TIERS")
	if !set {
		all := os.Getenv("CI") == "true"
		return func(string) bool { return all }
	}
	var tiers []string
	for t := range strings.SplitSeq(list, ",") {
		if t = strings.TrimSpace(t); t != "" {
			tiers = append(tiers, t)
		}
	}
	return func(tier string) bool { return slices.Contains(tiers, tier) }
}
