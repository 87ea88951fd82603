// Package hostaddr keeps the set of addresses a host's interfaces hold in
// one network namespace, current within moments of a change: what the
// egress gateway must never let a sandbox reach.
package hostaddr

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Set is the addresses of every interface in a namespace. Run keeps it
// current; Contains may be called at any time, from any goroutine.
type Set struct {
	ns  string // the namespace's path; "" = the caller's
	log *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	addrs map[netip.Addr]bool
}

// New reads the addresses of the namespace at path ("" = the namespace
// of the calling thread's process) once. log may be nil.
func New(path string, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Set{ns: path, log: log}
	if err := s.refresh(); err != nil {
		return nil, err
	}
	return s, nil
}

// Contains reports whether a (unmapped) is an address of the host.
func (s *Set) Contains(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[a.Unmap()]
}

// All returns the addresses, in no order.
func (s *Set) All() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]netip.Addr, 0, len(s.addrs))
	for a := range s.addrs {
		out = append(out, a)
	}
	return out
}

// handle opens a netlink handle in the set's namespace.
func (s *Set) handle() (*netlink.Handle, netns.NsHandle, error) {
	if s.ns == "" {
		h, err := netlink.NewHandle()
		return h, netns.None(), err
	}
	ns, err := netns.GetFromPath(s.ns)
	if err != nil {
		return nil, netns.None(), fmt.Errorf("hostaddr: namespace %s: %w", s.ns, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, netns.None(), err
	}
	return h, ns, nil
}

func (s *Set) refresh() error {
	h, ns, err := s.handle()
	if err != nil {
		return err
	}
	defer ns.Close()
	defer h.Close()
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("hostaddr: list addresses: %w", err)
	}
	addrs := make(map[netip.Addr]bool, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs[ip.Unmap()] = true
		}
	}
	s.mu.Lock()
	s.addrs = addrs
	s.mu.Unlock()
	return nil
}

// Run keeps the set current until ctx ends: it re-reads the addresses
// whenever the kernel reports a change, and every minute besides (a
// missed notification costs a minute at most).
func (s *Set) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := s.watch(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("watching the host's addresses; reading them every second until it works again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			if err := s.refresh(); err != nil {
				s.log.Warn("reading the host's addresses", "err", err)
			}
		}
	}
	return nil
}

// watch follows address updates until ctx ends or the subscription
// fails.
func (s *Set) watch(ctx context.Context) error {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	failed := make(chan error, 1)
	opts := netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
		select {
		case failed <- err:
		default:
		}
	}}
	if s.ns != "" {
		ns, err := netns.GetFromPath(s.ns)
		if err != nil {
			return err
		}
		defer ns.Close()
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(updates, done, opts); err != nil {
		return fmt.Errorf("hostaddr: subscribe: %w", err)
	}
	// Changes between New's read and the subscription.
	if err := s.refresh(); err != nil {
		return err
	}
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case _, ok := <-updates:
			if !ok {
				return fmt.Errorf("hostaddr: the subscription ended")
			}
			// Coalesce a burst of updates into one read.
			for drained := false; !drained; {
				select {
				case <-updates:
				default:
					drained = true
				}
			}
			if err := s.refresh(); err != nil {
				return err
			}
		case <-tick.C:
			if err := s.refresh(); err != nil {
				return err
			}
		}
	}
}
