// Package checkpoint is the arithmetic of automatic checkpoints: a
// sandbox's policy (api.CheckpointPolicy) checked and parsed, when the
// next checkpoint is due, and which checkpoints pruning removes. It
// decides; the control plane's leader acts (controlplane/checkpoints.go).
package checkpoint

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"space/api"
	"space/internal/httpapi"
)

// Bounds of a policy.
const (
	MinEvery = time.Second
	MaxEvery = 7 * 24 * time.Hour
	MaxKeep  = 1000
	// DefaultKeep is Keep when a policy leaves it 0.
	DefaultKeep = 20
	// DefaultMinExec is MinExec when a policy leaves it "".
	DefaultMinExec = 2 * time.Second
	// maxDuration bounds MinExec and KeepFor.
	maxDuration = 365 * 24 * time.Hour
)

// Policy is an api.CheckpointPolicy with its durations parsed and its
// defaults filled in.
type Policy struct {
	Every     time.Duration // 0: none on a schedule
	AfterExec bool
	MinExec   time.Duration
	Keep      int
	KeepFor   time.Duration // 0: no age limit
}

// Off reports whether the policy takes no checkpoints on its own.
func (p Policy) Off() bool { return p.Every == 0 && !p.AfterExec }

// FromAPI checks p and returns it parsed. Errors are
// httpapi.FieldError's naming field (the JSON field the policy is in,
// "checkpoints" at create) and the policy's field.
func FromAPI(field string, p api.CheckpointPolicy) (Policy, error) {
	bad := func(name, format string, args ...any) error {
		return httpapi.Invalid(field+"."+name, format, args...)
	}
	var (
		out Policy
		err error
	)
	if out.Every, err = duration(p.Every); err != nil {
		return out, bad("every", "%v", err)
	}
	if out.Every != 0 && (out.Every < MinEvery || out.Every > MaxEvery) {
		return out, bad("every", "%s is outside %s..%s", out.Every, MinEvery, MaxEvery)
	}
	out.AfterExec = p.AfterExec
	out.MinExec = DefaultMinExec
	if p.MinExec != "" {
		if out.MinExec, err = duration(p.MinExec); err != nil {
			return out, bad("min_exec", "%v", err)
		}
	}
	if out.MinExec > maxDuration {
		return out, bad("min_exec", "%s is more than a year", out.MinExec)
	}
	switch {
	case p.Keep < 0 || p.Keep > MaxKeep:
		return out, bad("keep", "%d is outside 0..%d (0 is %d)", p.Keep, MaxKeep, DefaultKeep)
	case p.Keep == 0:
		out.Keep = DefaultKeep
	default:
		out.Keep = p.Keep
	}
	if out.KeepFor, err = duration(p.KeepFor); err != nil {
		return out, bad("keep_for", "%v", err)
	}
	if out.KeepFor > maxDuration {
		return out, bad("keep_for", "%s is more than a year", out.KeepFor)
	}
	return out, nil
}

// duration parses a Go duration; "" is 0, a negative one is an error.
func duration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if len(s) > 32 {
		return 0, fmt.Errorf("%.32q...: not a duration", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration like 90s, 5m or 24h", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s is negative", s)
	}
	return d, nil
}

// API returns the policy as the API shows it: every field explicit.
func (p Policy) API() api.CheckpointPolicy {
	out := api.CheckpointPolicy{AfterExec: p.AfterExec, MinExec: p.MinExec.String(), Keep: p.Keep}
	if p.Every > 0 {
		out.Every = p.Every.String()
	}
	if p.KeepFor > 0 {
		out.KeepFor = p.KeepFor.String()
	}
	return out
}

// Parse reads a policy written as comma-separated settings, the form
// of flags and configuration: "every=5m,after_exec,keep=20,keep_for=24h"
// (also min_exec=D, after_exec=false; "off" or "" is no policy). The
// result still goes through FromAPI.
func Parse(s string) (api.CheckpointPolicy, error) {
	var p api.CheckpointPolicy
	s = strings.TrimSpace(s)
	if s == "" || s == "off" {
		return p, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, hasValue := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "every":
			p.Every = v
		case "min_exec":
			p.MinExec = v
		case "keep_for":
			p.KeepFor = v
		case "keep":
			n, err := strconv.Atoi(v)
			if err != nil {
				return p, fmt.Errorf("checkpoint policy: keep=%q is not a number", v)
			}
			p.Keep = n
		case "after_exec":
			if !hasValue {
				v = "true"
			}
			b, err := strconv.ParseBool(v)
			if err != nil {
				return p, fmt.Errorf("checkpoint policy: after_exec=%q is not true or false", v)
			}
			p.AfterExec = b
		default:
			return p, fmt.Errorf("checkpoint policy: unknown setting %q (want every, after_exec, min_exec, keep, keep_for)", k)
		}
		if !hasValue && k != "after_exec" {
			return p, fmt.Errorf("checkpoint policy: %s wants a value (%s=...)", k, k)
		}
	}
	return p, nil
}

// Exec is the last command a sandbox's worker saw end.
type Exec struct {
	Command        string
	Started, Ended time.Time
}

// Due returns what, if anything, should checkpoint a sandbox now: last is
// when its latest checkpoint began (or, with none, when it started),
// exec the last command that ended (nil: none known).
func (p Policy) Due(now, last time.Time, exec *Exec) (trigger string, due bool) {
	if p.AfterExec && exec != nil && exec.Ended.After(last) && exec.Ended.Sub(exec.Started) >= p.MinExec {
		return api.CheckpointExec, true
	}
	if p.Every > 0 && !now.Before(last.Add(p.Every)) {
		return api.CheckpointSchedule, true
	}
	return "", false
}

// Entry is a checkpoint as pruning sees it.
type Entry struct {
	ID      string
	Created time.Time
}

// Prune returns the IDs of the checkpoints in all that the policy no
// longer keeps: beyond the Keep newest, or older than KeepFor. The
// newest is always kept.
func (p Policy) Prune(now time.Time, all []Entry) []string {
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b Entry) int { return b.Created.Compare(a.Created) })
	var out []string
	for i, e := range sorted {
		if i == 0 {
			continue
		}
		if i >= p.Keep || (p.KeepFor > 0 && now.Sub(e.Created) > p.KeepFor) {
			out = append(out, e.ID)
		}
	}
	return out
}
