package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"space/internal/store"
)

// Event is one lifecycle event as a webhook receives it: the body of a
// delivery. Its JSON is the events API's (api.LifecycleEvent), so a
// receiver parses both alike.
type Event struct {
	// ID is "evt_<seq>", or "ping_…" for a ping; also sent as HeaderID.
	ID string `json:"id"`
	// Seq is the event's position in the control plane's event log; 0
	// for a ping. It is sent as Cursor, a decimal string.
	Seq           int64           `json:"-"`
	Cursor        string          `json:"cursor"`
	Time          time.Time       `json:"time"`
	Type          string          `json:"type"`
	SandboxID     string          `json:"sandbox_id"`
	Team          string          `json:"team"`
	State         string          `json:"state"`
	PreviousState string          `json:"previous_state"`
	Actor         string          `json:"actor"`
	RequestID     string          `json:"request_id"`
	Reason        string          `json:"reason"`
	Data          json.RawMessage `json:"data,omitempty"`
}

// EventID is the ID of the event at seq.
func EventID(seq int64) string { return "evt_" + strconv.FormatInt(seq, 10) }

// PingType is the type of the event POST /v1/webhooks/{id}/test sends.
const PingType = "ping"

// AttemptTimeout is how long one delivery attempt may take when
// SenderConfig.Timeout is 0: connecting, sending, and the receiver's
// answer.
const AttemptTimeout = 10 * time.Second

// SenderConfig configures a Sender.
type SenderConfig struct {
	// Guard decides which addresses may be dialed. Required.
	Guard *Guard
	// Timeout bounds one attempt; 0 = AttemptTimeout.
	Timeout time.Duration
	// Now is the clock of the timestamps; nil = time.Now.
	Now func() time.Time
	// UserAgent is sent with every delivery; "" = "space-webhooks".
	UserAgent string
}

// Sender POSTs signed events. It is safe for concurrent use.
type Sender struct {
	cfg    SenderConfig
	client *http.Client
}

// NewSender returns a Sender. Its connections dial only what cfg.Guard
// allows, ignore proxy settings (a proxy would dial for it), and never
// follow redirects (a 3xx is a failed attempt).
func NewSender(cfg SenderConfig) (*Sender, error) {
	if cfg.Guard == nil {
		return nil, errors.New("webhook sender: no guard")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = AttemptTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "space-webhooks"
	}
	d := &net.Dialer{Timeout: cfg.Timeout, Control: cfg.Guard.Control}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
	}
	return &Sender{cfg: cfg, client: &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}, nil
}

// Close closes the Sender's idle connections.
func (s *Sender) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// Result is the outcome of one attempt.
type Result struct {
	StatusCode int   // 0 if no response came
	Err        error // nil when the receiver answered 2xx
	Duration   time.Duration
}

// Delivered reports whether the receiver took the event.
func (r Result) Delivered() bool { return r.Err == nil }

// maxResponse is how much of a receiver's answer is read (so that its
// connection can be reused); the rest is dropped.
const maxResponse = 64 << 10

// Send POSTs ev to h.URL, once, written and signed as h.Format says
// with h.Secret, and reports how it went.
func (s *Sender) Send(ctx context.Context, h store.Webhook, ev Event) Result {
	start := time.Now()
	res := s.send(ctx, h, ev)
	res.Duration = time.Since(start)
	return res
}

func (s *Sender) send(ctx context.Context, h store.Webhook, ev Event) Result {
	var (
		body []byte
		err  error
	)
	if h.Format == store.WebhookFormatE2B {
		body, err = e2bBody(ev)
	} else {
		body, err = json.Marshal(ev)
	}
	if err != nil {
		return Result{Err: fmt.Errorf("encode event %s: %w", ev.ID, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return Result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", s.cfg.UserAgent)
	if h.Format == store.WebhookFormatE2B {
		signE2B(req.Header, h.ID, ev.ID, h.Secret, body)
	} else {
		Sign(req.Header, ev.ID, []string{h.Secret}, s.cfg.Now(), body)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponse))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return Result{StatusCode: resp.StatusCode, Err: fmt.Errorf("receiver answered %s", resp.Status)}
	}
	return Result{StatusCode: resp.StatusCode}
}

// FromStore is e as a webhook receives it.
func FromStore(e store.Event) Event {
	return Event{
		ID:            EventID(e.Seq),
		Seq:           e.Seq,
		Cursor:        strconv.FormatInt(e.Seq, 10),
		Time:          e.Time.UTC(),
		Type:          e.Type,
		SandboxID:     e.SandboxID,
		Team:          e.TeamID,
		State:         string(e.State),
		PreviousState: string(e.Prev),
		Actor:         e.Actor,
		RequestID:     e.RequestID,
		Reason:        e.Reason,
		Data:          e.Data,
	}
}

// StoreEvents is a [Source] reading the store's event log.
type StoreEvents struct {
	Store interface {
		ListEvents(ctx context.Context, q store.EventQuery) ([]store.Event, error)
	}
}

// Events implements [Source].
func (s StoreEvents) Events(ctx context.Context, teamID string, types []string, after int64, limit int) ([]Event, error) {
	if teamID == "" {
		return nil, errors.New("webhook events: no team") // "" would list every team's
	}
	evs, err := s.Store.ListEvents(ctx, store.EventQuery{TeamID: teamID, Types: types, After: after, Limit: limit})
	if err != nil {
		return nil, err
	}
	out := make([]Event, len(evs))
	for i, e := range evs {
		out[i] = FromStore(e)
	}
	return out, nil
}
