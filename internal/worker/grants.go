package worker

import (
	"context"
	"errors"
	"fmt"

	"space/internal/errkind"
	"space/internal/sandbox"
)

// SetSecrets replaces a running sandbox's grants and policy: it seals the
// values into the sandbox's record and saves it, then gives the gateway
// the new policy, writes the placeholder file of each grant into the
// guest and removes those of grants dropped. New execs get the new
// placeholders in their environment. A sandbox without network, or one
// not running, is a FailedPrecondition. On error the record, the gateway
// and the guest's placeholders are as they were, unless the error says
// the gateway could not be replaced (see below). While the worker holds
// no lease it is ErrNoLease.
func (w *Worker) SetSecrets(ctx context.Context, id string, req SecretsRequest) (Info, error) {
	if err := w.checkServing("set secrets of " + id); err != nil {
		return Info{}, err
	}
	n := req.Network
	if _, err := n.Policy(); err != nil {
		return Info{}, err
	}
	if err := checkGrants(Spec{Network: &n, Secrets: req.Secrets}); err != nil {
		return Info{}, err
	}
	sealed, err := w.sealValues(id, Spec{Secrets: req.Secrets}, req.SecretValues)
	if err != nil {
		return Info{}, err
	}
	s, err := w.get(id)
	if err != nil {
		return Info{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	state, gw, old := s.rec.State, s.gw, s.rec
	s.mu.Unlock()
	switch {
	case old.Spec.Network == nil || old.Net == nil:
		return Info{}, fmt.Errorf("%s has no network interface, so no gateway to add secrets: %w", id, errkind.FailedPrecondition)
	case state != sandbox.Running || gw == nil:
		return Info{}, fmt.Errorf("%s is %s: %w", id, state, ErrNotRunning)
	}
	agent, err := w.agentFor(ctx, id)
	if err != nil {
		return Info{}, err
	}
	s.setGrants(&n, req.Secrets, sealed)
	policy, err := w.fullPolicy(s, n)
	if err != nil {
		s.setGrants(old.Spec.Network, old.Spec.Secrets, old.Secrets)
		return Info{}, err
	}
	for _, g := range req.Secrets {
		if err := writeGuest(ctx, agent, guestSecretsDir+"/"+g.Name, []byte(g.Placeholder), 0o644); err != nil {
			s.setGrants(old.Spec.Network, old.Spec.Secrets, old.Secrets)
			return Info{}, errors.Join(err, w.removePlaceholders(ctx, s, req.Secrets, old.Spec.Secrets))
		}
	}
	if err := s.save(); err != nil {
		s.setGrants(old.Spec.Network, old.Spec.Secrets, old.Secrets)
		return Info{}, errors.Join(err, w.removePlaceholders(ctx, s, req.Secrets, old.Spec.Secrets))
	}
	gw.SetPolicy(policy)
	if err := w.removePlaceholders(ctx, s, old.Spec.Secrets, req.Secrets); err != nil {
		// The gateway replaces them no more: what is left is inert.
		w.log.Warn("remove dropped secrets' placeholders", "sandbox_id", id, "err", err)
	}
	w.log.Info("sandbox secrets set", "sandbox_id", id, "secrets", len(req.Secrets), "rules", len(n.Allow))
	return s.info(), nil
}

// removePlaceholders removes from s's guest the placeholder files of the
// grants in from that keep does not have.
func (w *Worker) removePlaceholders(ctx context.Context, s *sbx, from, keep []SecretGrant) error {
	kept := map[string]bool{}
	for _, g := range keep {
		kept[g.Name] = true
	}
	var errs []error
	for _, g := range from {
		if kept[g.Name] {
			continue
		}
		agent, err := w.agentFor(ctx, s.id())
		if err != nil {
			return err
		}
		if err := agent.Remove(ctx, guestSecretsDir+"/"+g.Name, false); err != nil && errkind.Of(err) != errkind.NotFound {
			errs = append(errs, fmt.Errorf("remove %s/%s in the guest: %w", guestSecretsDir, g.Name, err))
		}
	}
	return errors.Join(errs...)
}

// setGrants sets s's policy, grants and their sealed values.
func (s *sbx) setGrants(n *Network, grants []SecretGrant, sealed map[string][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rec.Spec.Network, s.rec.Spec.Secrets, s.rec.Secrets = n, grants, sealed
}
