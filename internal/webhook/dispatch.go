package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"space/internal/store"
)

// Source lists the lifecycle events a webhook has not had yet.
type Source interface {
	// Events returns, in order, up to limit events of team teamID after
	// sequence number after whose type is in types (any type if types is
	// empty). ID need not be set.
	Events(ctx context.Context, teamID string, types []string, after int64, limit int) ([]Event, error)
}

// Hooks holds the webhooks and their delivery state (a [store.Store]).
type Hooks interface {
	EnabledWebhooks(ctx context.Context) ([]store.Webhook, error)
	AddWebhookDelivery(ctx context.Context, d store.WebhookDelivery, disableAfter int) (store.Webhook, error)
}

// Defaults of Config.
const (
	DefaultPoll         = time.Second
	DefaultFirstBackoff = time.Second
	DefaultMaxBackoff   = 5 * time.Minute
	DefaultDisableAfter = 20
)

// batch is how many events a webhook's goroutine reads at a time.
const batch = 100

// Config configures a Dispatcher.
type Config struct {
	Source Source  // required
	Hooks  Hooks   // required
	Sender *Sender // required; the caller closes it
	// Poll is how often the enabled webhooks, and each one's new events,
	// are looked for; 0 = DefaultPoll.
	Poll time.Duration
	// FirstBackoff is the wait after an event's first failed attempt; it
	// doubles after each further one up to MaxBackoff. 0 =
	// DefaultFirstBackoff, and MaxBackoff 0 = DefaultMaxBackoff.
	FirstBackoff, MaxBackoff time.Duration
	// DisableAfter is how many consecutive failed attempts disable a
	// webhook; 0 = DefaultDisableAfter, negative = never.
	DisableAfter int
	// Metrics counts the attempts; nil = none.
	Metrics *Metrics
	// Log receives what goes wrong; nil = discard.
	Log *slog.Logger
}

// Dispatcher delivers each enabled webhook's events, in order and at
// least once: a webhook's cursor moves past an event only once its
// receiver answered 2xx. Every webhook has its own goroutine, so a slow
// or dead receiver delays only its own events. Run it on one replica at a
// time (the leader): two would both deliver.
type Dispatcher struct {
	cfg Config
	log *slog.Logger
}

// New returns a Dispatcher; Run starts it.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Source == nil || cfg.Hooks == nil || cfg.Sender == nil {
		return nil, errors.New("webhook dispatcher: source, hooks and sender are required")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.FirstBackoff <= 0 {
		cfg.FirstBackoff = DefaultFirstBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.FirstBackoff {
		cfg.MaxBackoff = cfg.FirstBackoff
	}
	if cfg.DisableAfter == 0 {
		cfg.DisableAfter = DefaultDisableAfter
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Dispatcher{cfg: cfg, log: log.With("component", "webhooks")}, nil
}

// hookRun is the goroutine delivering one webhook's events.
type hookRun struct {
	updated time.Time // the Updated of the record it delivers by
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine returned
}

func (r *hookRun) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Run delivers until ctx ends, then returns nil once every webhook's
// goroutine has returned. Each Poll it starts a goroutine for each
// enabled webhook without one, and stops those of webhooks deleted or
// disabled; one whose webhook the user changed (Updated moved on) is
// stopped and, once it returned, started again with the new record.
func (d *Dispatcher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]*hookRun{}
	defer func() {
		for _, r := range running {
			r.cancel()
		}
	}()
	tick := time.NewTicker(d.cfg.Poll)
	defer tick.Stop()
	for {
		hooks, err := d.cfg.Hooks.EnabledWebhooks(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("list webhooks", "err", err)
		}
		if err == nil {
			listed := make(map[string]bool, len(hooks))
			for _, h := range hooks {
				listed[h.ID] = true
				if r, ok := running[h.ID]; ok {
					if !r.updated.Equal(h.Updated) {
						r.cancel()
					}
					if !r.finished() {
						continue
					}
					delete(running, h.ID)
				}
				hctx, cancel := context.WithCancel(ctx)
				r := &hookRun{updated: h.Updated, cancel: cancel, done: make(chan struct{})}
				running[h.ID] = r
				wg.Go(func() {
					defer close(r.done)
					d.deliverAll(hctx, h)
				})
			}
			for id, r := range running {
				if !listed[id] {
					r.cancel()
					if r.finished() {
						delete(running, id)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// deliverAll delivers h's events, in order, until ctx ends or h is
// disabled or deleted.
func (d *Dispatcher) deliverAll(ctx context.Context, h store.Webhook) {
	log := d.log.With("webhook_id", h.ID, "team", h.TeamID)
	cursor := h.Cursor
	for {
		evs, err := d.cfg.Source.Events(ctx, h.TeamID, h.Types, cursor, batch)
		if err != nil && ctx.Err() == nil {
			log.Warn("read events", "err", err)
		}
		for _, ev := range evs {
			if ev.ID == "" {
				ev.ID = EventID(ev.Seq)
			}
			if ev.Cursor == "" {
				ev.Cursor = strconv.FormatInt(ev.Seq, 10)
			}
			if !d.deliver(ctx, log, h, ev) {
				return
			}
			cursor = ev.Seq
		}
		if len(evs) == batch {
			continue
		}
		if !sleep(ctx, d.cfg.Poll) {
			return
		}
	}
}

// deliver sends ev to h until the receiver takes it (true), or ctx ends,
// or h is disabled or deleted (false). Every attempt is logged.
func (d *Dispatcher) deliver(ctx context.Context, log *slog.Logger, h store.Webhook, ev Event) bool {
	for attempt := 1; ; attempt++ {
		res := d.cfg.Sender.Send(ctx, h, ev)
		if ctx.Err() != nil {
			return false // cut short by our own shutdown: not the receiver's failure
		}
		d.cfg.Metrics.attempted(res.Delivered(), res.Duration)
		rec := store.WebhookDelivery{
			WebhookID:  h.ID,
			EventSeq:   ev.Seq,
			EventType:  ev.Type,
			Attempt:    attempt,
			StatusCode: res.StatusCode,
			Duration:   res.Duration,
			Delivered:  res.Delivered(),
		}
		if res.Err != nil {
			rec.Error = store.TruncatedDeliveryError(res.Err.Error())
		}
		after, err := d.cfg.Hooks.AddWebhookDelivery(ctx, rec, d.cfg.DisableAfter)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return false // deleted
		case err != nil:
			// The attempt goes unlogged; a delivered event whose cursor
			// was not stored is sent again after a restart.
			log.Warn("log webhook delivery", "event", ev.ID, "err", err)
		case !after.Enabled:
			log.Info("webhook disabled", "reason", after.DisabledReason)
			if !res.Delivered() { // disabled by this failure, not by its team
				d.cfg.Metrics.disabledOne()
			}
			return false
		}
		if res.Delivered() {
			return true
		}
		log.Debug("webhook delivery failed", "event", ev.ID, "attempt", attempt, "status", res.StatusCode, "err", res.Err)
		if !sleep(ctx, d.backoff(attempt)) {
			return false
		}
	}
}

// backoff is the wait after the attempt-th failed attempt at an event.
func (d *Dispatcher) backoff(attempt int) time.Duration {
	b := d.cfg.FirstBackoff
	for i := 1; i < attempt && b < d.cfg.MaxBackoff; i++ {
		b *= 2
	}
	return min(b, d.cfg.MaxBackoff)
}

// sleep waits for d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Ping is the event a webhook's test sends: type PingType, a fresh ID,
// no sequence number (its delivery moves no cursor).
func Ping(teamID string, now time.Time) Event {
	var b [8]byte
	rand.Read(b[:])
	return Event{
		ID:   "ping_" + hex.EncodeToString(b[:]),
		Type: PingType,
		Time: now.UTC(),
		Team: teamID,
		Data: []byte(fmt.Sprintf(`{"message":%q}`, "this is a test delivery")),
	}
}
