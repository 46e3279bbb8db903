package gate

// Held reservations: the reserve/settle API reserves in one HTTP call and
// settles in another, perhaps on another replica. The reservation's id is
// a ticket that carries the reservation itself (its caller, its estimate
// and its items), signed with the replicas' shared secret, so that any
// replica can settle or release it without a lookup. The replica that
// reserved it also keeps it until it expires, to answer a second settle
// with the first one's figures and to settle it at its estimate (ledger
// status expired) when nobody did.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/policies"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

var (
	// ErrUnknownReservation is a reservation id that is not a valid
	// reservation of the caller: malformed, signed with another secret, or
	// another tenant's.
	ErrUnknownReservation = errors.New("gate: unknown reservation")
	// ErrExpired is a reservation past its expiry.
	ErrExpired = errors.New("gate: reservation expired")
	// ErrReleased is a reservation that was released.
	ErrReleased = errors.New("gate: reservation released")
	// ErrSettled is a reservation that was settled, which cannot be
	// released.
	ErrSettled = errors.New("gate: reservation settled")
)

// ticketPrefix starts every reservation id.
const ticketPrefix = "rsv_"

// ticket is a held reservation, as its id carries it.
type ticket struct {
	ID       string          `json:"i"`
	ResID    string          `json:"ri,omitempty"` // the limiter's id, when not ID
	Tenant   string          `json:"t"`
	User     string          `json:"us,omitempty"`
	KeyID    string          `json:"k,omitempty"`
	Plan     string          `json:"p,omitempty"`
	Route    string          `json:"r"`
	Upstream string          `json:"up,omitempty"`
	Model    string          `json:"m,omitempty"`
	Usage    costmodel.Usage `json:"u"`
	Cost     int64           `json:"c"`
	Requests int64           `json:"n"`
	Items    []ticketItem    `json:"it,omitempty"`
	Created  int64           `json:"cr"` // Unix microseconds
	Expires  int64           `json:"ex"` // Unix microseconds
	Degraded bool            `json:"d,omitempty"`
	Decision string          `json:"de,omitempty"`
	Policy   string          `json:"po,omitempty"`
	Friction string          `json:"f,omitempty"`
}

type ticketItem struct {
	Name string `json:"n"`
	Key  string `json:"k"`
	Cost int64  `json:"c"`
}

// holds are the reservations this replica handed out, until they expire.
type holds struct {
	mu sync.Mutex
	m  map[string]*hold
}

// hold is one held reservation's state on the replica that made it.
type hold struct {
	res     *Reservation
	expires time.Time
	state   holdState
	result  Charge // the settlement, once settled
}

type holdState uint8

const (
	holdOpen holdState = iota
	holdSettled
	holdReleased
	holdExpired
)

// secret is the key that signs tickets: the configured one, or one kept in
// the data directory.
func reservationSecret(cfg *config.Config) ([]byte, error) {
	if s := cfg.Reservations.SigningSecret(); s != "" {
		return []byte(s), nil
	}
	path := filepath.Join(cfg.DataDirPath(), "reservation.key")
	if b, err := os.ReadFile(path); err == nil {
		k, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err == nil && len(k) >= config.MinSecretLen {
			return k, nil
		}
		return nil, fmt.Errorf("gate: %s does not hold a key; remove it to make a new one", path)
	}
	k := make([]byte, 32)
	rand.Read(k)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("gate: reservation key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return reservationSecret(cfg) // another process made it first
	}
	if err != nil {
		return nil, fmt.Errorf("gate: reservation key: %w", err)
	}
	_, werr := f.WriteString(hex.EncodeToString(k) + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return nil, fmt.Errorf("gate: reservation key: %w", err)
	}
	return k, nil
}

func (g *Gate) sign(payload []byte) []byte {
	m := hmac.New(sha256.New, g.secret)
	m.Write(payload)
	return m.Sum(nil)[:16]
}

// Hold makes a recorded reservation outlive the request that made it: it
// returns the reservation's id, which any replica sharing the secret can
// Resume until it expires ttl from now, and the expiry. A reservation
// neither settled nor released by then is settled at its estimate, with
// ledger status expired, by the replica that holds it.
func (r *Reservation) Hold(ttl time.Duration) (string, time.Time) {
	now := time.Now()
	exp := now.Add(ttl)
	t := ticket{ID: r.req.ID, Tenant: r.req.Caller.Tenant, User: r.req.Caller.User, KeyID: r.req.Caller.KeyID,
		Plan: r.req.Caller.Plan, Route: r.req.Route, Upstream: r.req.Upstream, Model: r.req.Estimate.Model,
		Usage: r.req.Estimate.Usage, Cost: int64(r.req.Estimate.Cost), Requests: r.req.Requests,
		Created: r.start.UnixMicro(), Expires: exp.UnixMicro(), Degraded: r.degraded,
		Decision: string(r.decision.Outcome), Policy: r.decision.Policy, Friction: r.friction}
	if r.resID != r.req.ID {
		t.ResID = r.resID
	}
	for _, it := range r.items {
		t.Items = append(t.Items, ticketItem{Name: it.Limit.Name, Key: it.Key, Cost: it.Cost})
	}
	payload, _ := json.Marshal(t)
	id := ticketPrefix + base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(r.g.sign(payload))
	r.g.renewer.remove(r)
	r.g.holds.mu.Lock()
	r.g.holds.m[r.req.ID] = &hold{res: r, expires: exp}
	r.g.holds.mu.Unlock()
	return id, exp
}

// Resume returns the held reservation id for caller c, with its expiry.
// It fails with ErrUnknownReservation for an id that is not one of c's
// tenant's reservations, ErrExpired past its expiry, ErrReleased after a
// release on this replica. A reservation this replica settled already
// comes back with settled true and the charge it was settled with.
func (g *Gate) Resume(c *Caller, id string) (res *Reservation, expires time.Time, err error) {
	t, err := g.parseTicket(id)
	if err != nil || t.Tenant != c.Tenant {
		return nil, time.Time{}, ErrUnknownReservation
	}
	expires = time.UnixMicro(t.Expires)
	if !time.Now().Before(expires) {
		return nil, expires, ErrExpired
	}
	g.holds.mu.Lock()
	h := g.holds.m[t.ID]
	g.holds.mu.Unlock()
	if h != nil {
		return h.res, expires, nil
	}
	// Made by another replica (or before a restart): rebuild it.
	st := c.st
	r := &Reservation{g: g, st: st, resID: t.ID, start: time.UnixMicro(t.Created), ctx: context.Background(),
		recorded: true, degraded: t.Degraded, outcome: telemetry.OutcomeAllow}
	if t.ResID != "" {
		r.resID = t.ResID
	}
	r.req = Request{ID: t.ID, Caller: &Caller{Tenant: t.Tenant, User: t.User, KeyID: t.KeyID, Plan: t.Plan, st: st},
		Route: t.Route, Upstream: t.Upstream, Requests: t.Requests,
		Estimate: costmodel.Estimate{Model: t.Model, Usage: t.Usage, Cost: costmodel.NanoUSD(t.Cost)}}
	r.model = st.est.Canonical(t.Model)
	r.friction = t.Friction
	r.decision.Policy = t.Policy
	if t.Decision == string(policies.Soft) {
		r.outcome, r.decision.Outcome = telemetry.OutcomeSoft, policies.Soft
	}
	if r.degraded {
		r.fb = g.fallbackStore()
	}
	for _, it := range t.Items {
		l := st.limitNamed(it.Name)
		if l == nil {
			continue // gone from the configuration: nothing to settle
		}
		r.limits = append(r.limits, l)
		r.items = append(r.items, weighted.Item{Limit: l.limit, Key: it.Key, Cost: it.Cost})
	}
	if r.degraded {
		r.items = fallbackItems(r.items, st.cfg.Store.FallbackReplicas)
	}
	return r, expires, nil
}

func (g *Gate) parseTicket(id string) (ticket, error) {
	var t ticket
	body, ok := strings.CutPrefix(id, ticketPrefix)
	if !ok || len(id) > 16<<10 {
		return t, ErrUnknownReservation
	}
	p64, s64, ok := strings.Cut(body, ".")
	if !ok {
		return t, ErrUnknownReservation
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p64)
	sig, err2 := base64.RawURLEncoding.DecodeString(s64)
	if err1 != nil || err2 != nil || !hmac.Equal(sig, g.sign(payload)) {
		return t, ErrUnknownReservation
	}
	if err := json.Unmarshal(payload, &t); err != nil || t.ID == "" {
		return t, ErrUnknownReservation
	}
	return t, nil
}

// SettleHeld settles a held reservation with c. On the replica that holds
// it, a second settlement changes nothing and returns the first one's
// charge with again true; elsewhere the limiter and the ledger, which are
// idempotent by reservation id, make a second settlement change nothing.
func (r *Reservation) SettleHeld(ctx context.Context, c Charge) (charged Charge, again bool, err error) {
	h := r.g.hold(r.req.ID)
	if h != nil {
		r.g.holds.mu.Lock()
		switch h.state {
		case holdSettled:
			out := h.result
			r.g.holds.mu.Unlock()
			return out, true, nil
		case holdReleased:
			r.g.holds.mu.Unlock()
			return Charge{}, false, ErrReleased
		case holdExpired:
			r.g.holds.mu.Unlock()
			return Charge{}, false, ErrExpired
		}
		h.state, h.result = holdSettled, c
		r.g.holds.mu.Unlock()
	}
	r.Settle(ctx, c)
	return c, false, nil
}

// Release cancels a held reservation: its limits get their reserved cost
// back and its ledger entry is settled as failed, at no cost. Releasing
// twice is no error; releasing a settled reservation is ErrSettled.
func (r *Reservation) Release(ctx context.Context) error {
	h := r.g.hold(r.req.ID)
	if h != nil {
		r.g.holds.mu.Lock()
		switch h.state {
		case holdSettled:
			r.g.holds.mu.Unlock()
			return ErrSettled
		case holdReleased:
			r.g.holds.mu.Unlock()
			return nil
		case holdExpired:
			r.g.holds.mu.Unlock()
			return ErrExpired
		}
		h.state = holdReleased
		r.g.holds.mu.Unlock()
	}
	r.Cancel(ctx)
	return nil
}

func (g *Gate) hold(id string) *hold {
	g.holds.mu.Lock()
	defer g.holds.mu.Unlock()
	return g.holds.m[id]
}

// expireHolds settles at their estimate the open reservations past their
// expiry, and forgets every reservation past it. The gate runs it every
// second.
func (g *Gate) expireHolds(now time.Time) {
	var due []*hold
	g.holds.mu.Lock()
	for id, h := range g.holds.m {
		if now.Before(h.expires) {
			continue
		}
		if h.state == holdOpen {
			h.state = holdExpired
			due = append(due, h)
		}
		delete(g.holds.m, id)
	}
	g.holds.mu.Unlock()
	for _, h := range due {
		r := h.res
		est := r.req.Estimate
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.Settle(ctx, Charge{Usage: est.Usage, Cost: est.Cost, Status: ledger.StatusExpired, HTTPStatus: 0, Extra: nil})
		cancel()
		g.log.Info("reservation expired; settled at its estimate", "request_id", r.req.ID, "tenant", r.req.Caller.Tenant)
	}
}

// expireLoop runs expireHolds every second until ctx ends.
func (g *Gate) expireLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			g.expireHolds(now)
		}
	}
}

// limitNamed is the configured limit or budget named name, or nil.
func (st *state) limitNamed(name string) *compiledLimit {
	for _, l := range st.limits {
		if l.limit.Name == name {
			return l
		}
	}
	return nil
}
