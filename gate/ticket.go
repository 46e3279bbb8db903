package gate

// Held reservations: the reserve/settle API reserves in one HTTP call and
// settles in another, perhaps on another replica. The reservation's id is
// a ticket that carries the reservation itself (its caller, its estimate
// and its items), signed with the replicas' shared secret, so that any
// replica can settle or release it without a lookup. The replica that
// reserved it also keeps it until it expires, to answer a second settle
// with the first one's figures and to settle it at its estimate (ledger
// status expired) when nobody did; once ended, until claimGrace past its
// expiry, to tell a settle retried late how it ended, as the claim in
// Redis tells the other replicas.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	ID       string `json:"i"`
	ResID    string `json:"ri,omitempty"` // the limiter's id, when not ID
	Tenant   string `json:"t"`
	User     string `json:"us,omitempty"`
	KeyID    string `json:"k,omitempty"`
	Plan     string `json:"p,omitempty"`
	Route    string `json:"r"`
	Name     string `json:"na,omitempty"`
	Upstream string `json:"up,omitempty"`
	Model    string `json:"m,omitempty"`
	// Kind is the API of the LLM request the reservation was estimated
	// from (costmodel.Kind's name); empty for one reserved by its amounts
	// (Estimate.Kind Generic), and in a ticket made before it was carried.
	Kind     string          `json:"ki,omitempty"`
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
	// Kind is the counter the item was debited on (see kindOf); 0 in a
	// ticket made before it was carried.
	Kind int64 `json:"a,omitempty"`
	// Model is the other model (see others.go) whose item this is of a
	// limit keyed by model; empty for the request's own model's.
	Model string `json:"mo,omitempty"`
}

// kindOf names the counter a limit's items are kept in, beside its name
// and key: its algorithm and calendar. A limit whose kind changed keeps
// its items elsewhere.
func kindOf(l *weighted.Limit) int64 { return 1 + int64(l.Algorithm) + 16*int64(l.Calendar) }

// appendJSON appends t as JSON that json.Unmarshal reads back into t
// (TestTicketJSON), with the field names of its tags, ID first (see
// resumeHeld), zero values of omitempty fields left out; without
// reflection, which cost a reserve most of Hold.
func (t *ticket) appendJSON(b []byte) []byte {
	b = append(b, `{"i":`...)
	b = appendJSONString(b, t.ID)
	str := func(name, v string, omitEmpty bool) {
		if v == "" && omitEmpty {
			return
		}
		b = append(append(append(b, ",\""...), name...), `":`...)
		b = appendJSONString(b, v)
	}
	num := func(name string, v int64, omitZero bool) {
		if v == 0 && omitZero {
			return
		}
		b = append(append(append(b, ",\""...), name...), `":`...)
		b = strconv.AppendInt(b, v, 10)
	}
	str("ri", t.ResID, true)
	str("t", t.Tenant, false)
	str("us", t.User, true)
	str("k", t.KeyID, true)
	str("p", t.Plan, true)
	str("r", t.Route, false)
	str("na", t.Name, true)
	str("up", t.Upstream, true)
	str("m", t.Model, true)
	str("ki", t.Kind, true)
	b = append(b, `,"u":`...)
	b = appendUsageJSON(b, &t.Usage)
	num("c", t.Cost, false)
	num("n", t.Requests, false)
	if len(t.Items) > 0 {
		b = append(b, `,"it":[`...)
		for i, it := range t.Items {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"n":`...)
			b = appendJSONString(b, it.Name)
			str("k", it.Key, false)
			num("c", it.Cost, false)
			num("a", it.Kind, true)
			str("mo", it.Model, true)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	num("cr", t.Created, false)
	num("ex", t.Expires, false)
	if t.Degraded {
		b = append(b, `,"d":true`...)
	}
	str("de", t.Decision, true)
	str("po", t.Policy, true)
	str("f", t.Friction, true)
	return append(b, '}')
}

// appendUsageJSON appends u as JSON that json.Unmarshal reads back into
// a costmodel.Usage (but Steps, which its JSON leaves out): input and
// output tokens always, the other fields when not zero.
func appendUsageJSON(b []byte, u *costmodel.Usage) []byte {
	num := func(name string, v int64, omitZero bool) {
		if v == 0 && omitZero {
			return
		}
		b = append(append(append(b, ",\""...), name...), `":`...)
		b = strconv.AppendInt(b, v, 10)
	}
	str := func(name, v string) {
		if v == "" {
			return
		}
		b = append(append(append(b, ",\""...), name...), `":`...)
		b = appendJSONString(b, v)
	}
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, u.InputTokens, 10)
	num("cached_input_tokens", u.CachedInputTokens, true)
	num("cache_write_tokens", u.CacheWriteTokens, true)
	num("cache_write_1h_tokens", u.CacheWrite1hTokens, true)
	num("audio_input_tokens", u.AudioInputTokens, true)
	num("output_tokens", u.OutputTokens, false)
	num("reasoning_tokens", u.ReasoningTokens, true)
	num("audio_output_tokens", u.AudioOutputTokens, true)
	num("web_search_requests", u.WebSearchRequests, true)
	num("file_search_calls", u.FileSearchCalls, true)
	num("container_gb", u.ContainerGB, true)
	num("units", u.Units, true)
	str("service_tier", u.ServiceTier)
	str("inference_geo", u.InferenceGeo)
	str("speed", u.Speed)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 as U+FFFD, as json.Marshal
// reads it back.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// holds are the reservations this replica handed out, by request id: in
// m until they expire, then in ended until at least claimGrace past their
// expiry (see expireHolds). Its fields are guarded by mu, as are those of
// each hold.
type holds struct {
	mu sync.Mutex
	m  map[string]*hold
	// ended[0] takes the holds that expire; every claimGrace it becomes
	// ended[1], whose holds are then dropped: an ended hold is kept from
	// claimGrace to twice that past its expiry, and expireHolds never
	// walks the holds past their expiry. nil until the first expireHolds.
	ended   [2]map[string]*hold
	rotated time.Time // when ended[0] was started
}

// find is the hold of request id, or nil. The caller holds mu.
func (hs *holds) find(id string) *hold {
	if h := hs.m[id]; h != nil {
		return h
	}
	if h := hs.ended[0][id]; h != nil {
		return h
	}
	return hs.ended[1][id]
}

// hold is one held reservation's state on the replica that made it; res
// is dropped once it has ended or expired, so that an ended hold weighs
// little while it is kept.
type hold struct {
	res     *Reservation
	tenant  string
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

// sigLen is the length of a ticket's signature: the first half of its
// HMAC-SHA256.
const sigLen = 16

// sign appends payload's signature to b. The MACs keyed with the secret
// are reused (g.macs): one keyed anew costs a reserve five allocations.
func (g *Gate) sign(b, payload []byte) []byte {
	m, _ := g.macs.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, g.secret)
	}
	m.Reset()
	m.Write(payload)
	var sum [sha256.Size]byte
	b = append(b, m.Sum(sum[:0])[:sigLen]...)
	g.macs.Put(m)
	return b
}

// ticketBufs are Hold's scratch buffers: a ticket's JSON and its id
// before the id becomes a string.
var ticketBufs = sync.Pool{New: func() any { return &[2][]byte{make([]byte, 0, 512), make([]byte, 0, 1024)} }}

// maxPooledTicket bounds the buffers kept: a ticket of many limits' items
// does not leave a large one behind.
const maxPooledTicket = 16 << 10

// Hold makes a recorded reservation outlive the request that made it: it
// returns the reservation's id, which any replica sharing the secret can
// Resume until it expires ttl from now, and the expiry. A reservation
// neither settled nor released by then is settled at its estimate, with
// ledger status expired, by the replica that holds it.
func (r *Reservation) Hold(ttl time.Duration) (string, time.Time) {
	now := time.Now()
	exp := now.Add(ttl)
	t := ticket{ID: r.req.ID, Tenant: r.req.Caller.Tenant, User: r.req.Caller.User, KeyID: r.req.Caller.KeyID,
		Plan: r.req.Caller.Plan, Route: r.req.Route, Name: r.req.Name, Upstream: r.req.Upstream, Model: r.req.Estimate.Model,
		Usage: r.req.Estimate.Usage, Cost: int64(r.req.Estimate.Cost), Requests: r.req.Requests,
		Created: r.start.UnixMicro(), Expires: exp.UnixMicro(), Degraded: r.degraded,
		Decision: string(r.decision.Outcome), Policy: r.decision.Policy, Friction: r.friction}
	if r.resID != r.req.ID {
		t.ResID = r.resID
	}
	if k := r.req.Estimate.Kind; k != costmodel.Generic {
		t.Kind = k.String()
	}
	// The items go in a buffer on the stack when they fit (t does not
	// escape): a reserve's usual few items then cost Hold no allocation.
	var ibuf [8]ticketItem
	t.Items = ibuf[:0]
	for i, it := range r.items {
		ti := ticketItem{Name: it.Limit.Name, Key: it.Key, Cost: it.Cost, Kind: kindOf(&it.Limit)}
		if i < len(r.limits) {
			ti.Model = r.limits[i].model
		}
		t.Items = append(t.Items, ti)
	}
	bp := ticketBufs.Get().(*[2][]byte)
	payload := t.appendJSON(bp[0][:0])
	var sig [sigLen]byte
	enc := base64.RawURLEncoding
	b := append(bp[1][:0], ticketPrefix...)
	b = enc.AppendEncode(b, payload)
	b = append(b, '.')
	b = enc.AppendEncode(b, r.g.sign(sig[:0], payload))
	id := string(b)
	if cap(b) <= maxPooledTicket {
		bp[0], bp[1] = payload[:0], b[:0]
		ticketBufs.Put(bp)
	}
	// Its concurrency units stay renewed until it is settled, released or
	// expired (each ends it, and its renewals, through settle or cancel):
	// a slot is held as long as its request runs. A renewal after another
	// replica ended it moves nothing (a settled unit is gone for good).
	r.expires = exp
	r.held = &hold{res: r, tenant: r.req.Caller.Tenant, expires: exp}
	r.g.holds.mu.Lock()
	r.g.holds.m[r.req.ID] = r.held
	r.g.holds.mu.Unlock()
	return id, exp
}

// Resume returns the held reservation id for caller c, with its expiry.
// It fails with ErrUnknownReservation for an id that is not one of c's
// tenant's reservations. A reservation that ended already comes back all
// the same: its SettleHeld answers the first settlement (again true) or
// ErrReleased, its Release ErrSettled or nil. Past its expiry, Resume
// fails with ErrExpired unless the reservation was settled or released
// before: this replica's hold tells so, else its final entry in the
// ledger (when this replica holds none; a lookup bounded by a second),
// else, with a Redis store, the reservation's claim there, whose end
// Resume then bills where the ledger lacks it (see billAdopted). Finding
// none, Resume claims the expiry itself, so that a settlement racing it cannot end it too (a SETNX and,
// when another end is there, a GET, bounded by ctx and a second: the
// calls to Redis Resume makes; when they fail, ErrExpired).
func (g *Gate) Resume(ctx context.Context, c *Caller, id string) (res *Reservation, expires time.Time, err error) {
	payload, ok := g.verify(id)
	if !ok {
		return nil, time.Time{}, ErrUnknownReservation
	}
	if r, exp, ok := g.resumeHeld(c, payload); ok {
		return r, exp, nil
	}
	var t ticket
	if err := json.Unmarshal(payload, &t); err != nil || t.ID == "" || t.Tenant != c.Tenant {
		return nil, time.Time{}, ErrUnknownReservation
	}
	expires = time.UnixMicro(t.Expires)
	g.holds.mu.Lock()
	h := g.holds.find(t.ID)
	var open *Reservation
	if h != nil && h.tenant != t.Tenant {
		h = nil
	} else if h != nil {
		open = h.res
	}
	g.holds.mu.Unlock()
	var adopted claim
	var here bool
	switch {
	case !time.Now().Before(expires):
		if h, adopted, here, err = g.endOf(ctx, &t, expires, h); err != nil {
			return nil, expires, err
		}
	case open != nil:
		return open, expires, nil
	}
	// Made by another replica (or before a restart), or ended: rebuild
	// it, with h to answer for its end.
	r := g.rebuild(c, &t, expires)
	r.held = h
	r.billAdopted(ctx, adopted, nil, here)
	return r, expires, nil
}

// endOf tells how held reservation t, past its expiry, ended: h, this
// replica's hold of it (nil for none), when it was settled or released,
// else a hold made from its entry in the ledger, final, when this replica
// holds none, else from its claim in Redis, which h adopts. It is
// ErrExpired when it expired, or when none tells. adopted is the claim
// adopted, for the caller to bill (billAdopted, with here: h was this
// replica's open hold of the reservation it made); its state is holdOpen
// when none was.
func (g *Gate) endOf(ctx context.Context, t *ticket, expires time.Time, h *hold) (end *hold, adopted claim, here bool, err error) {
	if h != nil {
		g.holds.mu.Lock()
		st, open := h.state, h.res != nil
		g.holds.mu.Unlock()
		if st == holdSettled || st == holdReleased {
			return h, claim{}, false, nil
		}
		here = st == holdOpen && open
	}
	if h == nil {
		// Made by another replica, or before a restart: a settlement or a
		// release billed is in the ledger, when no claim in Redis tells.
		switch out, again, err, _ := g.endedInLedger(ctx, t.ID, expires); {
		case again:
			return &hold{tenant: t.Tenant, expires: expires, state: holdSettled, result: out}, claim{}, false, nil
		case errors.Is(err, ErrReleased):
			return &hold{tenant: t.Tenant, expires: expires, state: holdReleased}, claim{}, false, nil
		}
	}
	if g.redis == nil {
		return nil, claim{}, false, ErrExpired
	}
	// No end is recorded: this one is the expiry, claimed so that a
	// settlement of it still in flight (one resumed before the expiry)
	// loses to it rather than end it a second way. The replica holding it
	// settles it at its estimate all the same (see expireHolds).
	won, c, err := g.claimAt(ctx, t.ID, heldKey(t.Tenant, t.ID), claimGrace, claim{state: holdExpired, token: newClaimToken()})
	switch {
	case err != nil:
		g.log.Warn("held reservation past its expiry: its claim in Redis failed; taken for expired", "request_id", t.ID, "err", err)
	case !won && c.state != holdExpired:
		g.adopt(h, c) // an open hold must not expire after all
		return &hold{tenant: t.Tenant, expires: expires, state: c.state, result: c.charge()}, c, here, nil
	}
	return nil, claim{}, false, ErrExpired
}

// rebuild makes the reservation ticket t carries, for caller c.
func (g *Gate) rebuild(c *Caller, t *ticket, expires time.Time) *Reservation {
	st := c.st
	r := &Reservation{g: g, st: st, resID: t.ID, start: time.UnixMicro(t.Created), ctx: context.Background(), expires: expires,
		recorded: true, degraded: t.Degraded, outcome: telemetry.OutcomeAllow}
	if t.ResID != "" {
		r.resID = t.ResID
	}
	r.req = Request{ID: t.ID, Caller: &Caller{Tenant: t.Tenant, User: t.User, KeyID: t.KeyID, Plan: t.Plan, st: st},
		Route: t.Route, Name: t.Name, Upstream: t.Upstream, Requests: t.Requests,
		Estimate: costmodel.Estimate{Kind: costmodel.Generic, Model: t.Model, Usage: t.Usage, Cost: costmodel.NanoUSD(t.Cost)}}
	if k, err := costmodel.ParseKind(t.Kind); t.Kind != "" && err == nil {
		r.req.Estimate.Kind = k
	}
	r.model = st.est.Canonical(t.Model)
	r.friction = t.Friction
	r.decision.Policy = t.Policy
	if t.Decision == string(policies.Soft) {
		r.outcome, r.decision.Outcome = telemetry.OutcomeSoft, policies.Soft
	}
	for _, it := range t.Items {
		l := st.limitNamed(it.Name)
		if l == nil {
			l = g.levelLimitNamed(c, t.Tenant, it.Name, it.Key, r.start)
		}
		if l == nil || it.Kind != 0 && kindOf(&l.limit) != it.Kind || it.Model != "" && !l.byModel {
			continue // gone from the configuration, or counted elsewhere now: nothing to settle
		}
		if it.Model != "" {
			// Another model's item (see others.go): settled with that
			// model's steps of the usage.
			o := *l
			o.model = it.Model
			l = &o
		}
		r.limits = append(r.limits, l)
		r.items = append(r.items, weighted.Item{Limit: l.limit, Key: it.Key, Cost: it.Cost})
	}
	if r.degraded {
		r.toFallback()
	}
	return r
}

// levelLimitNamed is the control-plane level limit named name on key, as
// it stood at now (a raised amount in force then), or nil: among the
// levels of c, who settles (the key that reserved, most often), else among
// the limits of every level of tenant (LevelLimiter; a Directory without
// it, the budgets), so that the limits of the key that reserved are
// charged whichever of the tenant's keys settles.
func (g *Gate) levelLimitNamed(c *Caller, tenant, name, key string, now time.Time) *compiledLimit {
	match := func(ll *LevelLimit) *compiledLimit {
		if l := ll.at(now).cl; l.limit.Name == name && l.fixedKey == key {
			return l
		}
		return nil
	}
	for _, lv := range c.levels {
		if lv == nil {
			continue
		}
		for _, ll := range lv.Limits {
			if l := match(ll); l != nil {
				return l
			}
		}
	}
	if d := g.dir.dir.Load(); d != nil {
		all := (*d).Budgets
		if ll, ok := (*d).(LevelLimiter); ok {
			all = ll.LevelLimits
		}
		for _, lb := range all(tenant) {
			if l := match(lb.Limit); l != nil {
				return l
			}
		}
	}
	return nil
}

// maxTicket bounds the length of a ticket verify accepts, in bytes: the
// reserve/settle API's body bound (proxy's maxReserveBody, 1 MiB), which
// no id the API carries can exceed. Hold makes a ticket as long as its
// items need (a legal configuration keys limits by many long attributes),
// so a lower bound would refuse ids the API handed out.
const maxTicket = 1 << 20

// ticketEncoding reads a ticket's parts: one spelling per ticket, so that
// no two ids verify as one. Strict base64 refuses bits set past the data in
// a last character; line breaks, which any base64 decoder skips, verify
// refuses itself.
var ticketEncoding = base64.RawURLEncoding.Strict()

// verify returns the payload of ticket id, if its signature is this
// gate's secret's.
func (g *Gate) verify(id string) ([]byte, bool) {
	body, ok := strings.CutPrefix(id, ticketPrefix)
	if !ok || len(id) > maxTicket {
		return nil, false
	}
	p64, s64, ok := strings.Cut(body, ".")
	if !ok || strings.ContainsAny(body, "\r\n") {
		return nil, false
	}
	enc := ticketEncoding
	if len(s64) != enc.EncodedLen(sigLen) {
		return nil, false
	}
	var sig, want [sigLen]byte
	payload, err1 := enc.DecodeString(p64)
	_, err2 := enc.Decode(sig[:], []byte(s64))
	if err1 != nil || err2 != nil || !hmac.Equal(sig[:], g.sign(want[:0], payload)) {
		return nil, false
	}
	return payload, true
}

// resumeHeld is Resume's short way to a reservation this replica holds
// open, for c's tenant, before its expiry: the hold is found by the
// request id a verified ticket's payload starts with (appendJSON writes
// ticket.ID first), without decoding the rest. ok is false for any other
// ticket, which Resume then reads whole.
func (g *Gate) resumeHeld(c *Caller, payload []byte) (*Reservation, time.Time, bool) {
	rest, ok := bytes.CutPrefix(payload, []byte(`{"i":"`))
	end := bytes.IndexByte(rest, '"')
	if !ok || end <= 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, time.Time{}, false
	}
	g.holds.mu.Lock()
	h := g.holds.m[string(rest[:end])]
	var r *Reservation
	var exp time.Time
	if h != nil {
		r, exp = h.res, h.expires
	}
	g.holds.mu.Unlock()
	if r == nil || r.req.Caller.Tenant != c.Tenant || !time.Now().Before(exp) {
		return nil, time.Time{}, false
	}
	return r, exp, true
}

// SettleHeld settles a held reservation with c, once: a second
// settlement changes nothing and returns the first one's charge with again
// true. With a Redis store, the first settlement, release or expiry of a
// reservation is claimed there, so that replicas agree on which one
// counts; without one (a single node) this replica's memory decides.
func (r *Reservation) SettleHeld(ctx context.Context, c Charge) (charged Charge, again bool, err error) {
	h := r.hold()
	if out, again, err, done := r.g.ended(h); done {
		return out, again, err
	}
	if out, again, err, done := r.endedInLedger(ctx, h); done {
		return out, again, err
	}
	actual := r.actual(c)
	won, prior, stored, perr := r.g.end(ctx, r, settledClaim(c), actual)
	if errors.Is(perr, errClaimsLost) {
		if out, again, err, done := r.endedAfterLoss(ctx, h); done {
			return out, again, err
		}
		return r.SettleHeld(ctx, c)
	}
	if perr == nil && !won {
		here := r.g.holdsOpen(h, r)
		r.g.adopt(h, prior)
		r.billAdopted(ctx, prior, &c, here)
		return prior.answer()
	}
	if h != nil {
		r.g.holds.mu.Lock()
		// A claim won in Redis is the end, even over this replica's own
		// expiry, which marks the hold before it claims and gives up when
		// it loses. Without a claim, the hold's state decides.
		if h.state != holdOpen && perr != nil {
			r.g.holds.mu.Unlock()
			out, again, err, _ := r.g.ended(h)
			return out, again, err
		}
		h.state, h.result, h.res = holdSettled, c, nil // the state is all a settled hold needs
		r.g.holds.mu.Unlock()
	} else if perr != nil && !r.g.endAlone(r, holdSettled, c) {
		return r.SettleHeld(ctx, c) // another end came first: answered from it
	}
	r.settle(ctx, c, actual, stored)
	return c, false, nil
}

// Release cancels a held reservation: its limits get their reserved cost
// back and its ledger entry is settled as failed, at no cost. Releasing
// twice is no error; releasing a settled reservation is ErrSettled.
func (r *Reservation) Release(ctx context.Context) error {
	h := r.hold()
	_, again, err, done := r.g.ended(h)
	if !done {
		_, again, err, done = r.endedInLedger(ctx, h)
	}
	if done {
		return releaseAnswer(again, err)
	}
	won, prior, stored, perr := r.g.end(ctx, r, claim{state: holdReleased}, nil)
	if errors.Is(perr, errClaimsLost) {
		if _, again, err, done := r.endedAfterLoss(ctx, h); done {
			return releaseAnswer(again, err)
		}
		return r.Release(ctx)
	}
	if perr == nil && !won {
		here := r.g.holdsOpen(h, r)
		r.g.adopt(h, prior)
		r.billAdopted(ctx, prior, nil, here)
		switch prior.state {
		case holdSettled:
			return ErrSettled
		case holdExpired:
			return ErrExpired
		}
		return nil
	}
	if h != nil {
		r.g.holds.mu.Lock()
		// A claim won decides (see SettleHeld); without one, the first
		// end the hold records does, another release's included.
		mine := h.state == holdOpen || perr == nil
		if mine {
			h.state, h.res = holdReleased, nil
		}
		r.g.holds.mu.Unlock()
		if !mine {
			return r.Release(ctx)
		}
	} else if perr != nil && !r.g.endAlone(r, holdReleased, Charge{}) {
		return r.Release(ctx)
	}
	r.cancel(ctx, stored)
	return nil
}

// billAdopted bills the end c, which another call claimed in Redis and
// this one adopts, where r's ledger entry is not final yet (billClaimed,
// here as it says): the replica that claims an end writes it to its
// ledger after the claim, and one killed between the two left the end to
// whichever replica finds its claim, whether to answer a retry of it,
// another end, a resume past the expiry or the expiry pass. A settlement
// is billed as its claim records it; one of an earlier version, which
// records no usage, at its cost and status, with like's usage, model and
// HTTP status when like (this call's own settlement, or nil) has its
// cost and status. A release is billed failed, at no cost. An expiry is
// billed by the replica that made r (see expireHolds).
func (r *Reservation) billAdopted(ctx context.Context, c claim, like *Charge, here bool) {
	switch c.state {
	case holdSettled:
		ch := c.charge()
		if !c.billed && like != nil && like.Cost == c.cost && like.Status == c.status {
			ch = *like
		}
		r.billClaimed(ctx, ch, here)
	case holdReleased:
		r.billClaimed(ctx, Charge{Status: ledger.StatusFailed}, here)
	}
}

// billClaimed writes c, the end another call claimed in Redis first
// (see billAdopted), to this replica's ledger, where r's entry is: here
// tells that this replica made r and held it open (its entry is in its
// ledger, though perhaps still in the spool); otherwise the entry the
// ledger's store holds must be reserved, or recovered at its estimate by
// a restart. The ledger keeps the first settlement of an entry (over a
// recovery), so that the claiming replica's own write, when it comes,
// changes nothing, nor this one after it, nor another replica's that
// adopts the same claim. An entry this replica's ledger does not hold (an
// embedded ledger, another replica's reservation) is not written.
func (r *Reservation) billClaimed(ctx context.Context, c Charge, here bool) {
	if !here {
		// Waited for longer than a lookup of the request path: until
		// the ledger answers, this replica cannot tell whether it holds
		// the entry, and a bill not written leaves the entry at its
		// estimate. A restarted ledger's replay under load took more
		// than a second (gate.TestClaimedEndAtkRetryBeforeTheReplay).
		e, ok, err := r.g.ledgerEntry(context.WithoutCancel(ctx), r.req.ID, billLookup)
		if err != nil {
			r.g.log.Error("ledger: an end claimed before could not be billed: the ledger did not answer", "request_id", r.req.ID, "err", err)
		}
		if err != nil || !ok || e.Status != ledger.StatusReserved && e.Status != ledger.StatusRecovered {
			return
		}
	}
	// Written apart from r's own record of its bill: an end of r that
	// won its claim on this replica may be billing r at the same time.
	if err := r.g.ledger.Settle(context.WithoutCancel(ctx), r.billEntry(c)); err != nil {
		r.g.log.Error("ledger settle of an end claimed before failed", "request_id", r.req.ID, "err", err)
	}
}

// holdsOpen tells whether h is this replica's open hold of r, the
// reservation it made.
func (g *Gate) holdsOpen(h *hold, r *Reservation) bool {
	if h == nil {
		return false
	}
	g.holds.mu.Lock()
	defer g.holds.mu.Unlock()
	return h.state == holdOpen && h.res == r
}

// releaseAnswer is Release's answer for a reservation that had ended
// (again and err as ended tells): ErrSettled for a settled one, none for
// a released one, ErrExpired for an expired one.
func releaseAnswer(again bool, err error) error {
	if again {
		return ErrSettled
	}
	if errors.Is(err, ErrReleased) {
		return nil
	}
	return err
}

// endedAfterLoss tells how held reservation r ended, as the ledger says,
// after the limiter store lost the claims of its tags (errClaimsLost) and
// every replica wrote its records: this replica's hold h, if any, is open
// here but may have been ended on another replica, which only the lost
// claim said. An end found there is adopted by h.
func (r *Reservation) endedAfterLoss(ctx context.Context, h *hold) (out Charge, again bool, err error, done bool) {
	out, again, err, done = r.g.endedInLedger(ctx, r.req.ID, r.expires)
	if done {
		r.g.adopt(h, ledgerClaim(out, again, err))
	}
	return out, again, err, done
}

// ledgerClaim is the claim of an end endedInLedger found.
func ledgerClaim(out Charge, again bool, err error) claim {
	switch {
	case again:
		return claim{state: holdSettled, cost: out.Cost, status: out.Status}
	case errors.Is(err, ErrReleased):
		return claim{state: holdReleased}
	}
	return claim{state: holdExpired}
}

// endAlone records on this replica that held reservation r ends so (st,
// c), when the replica holds no hold of r (made by another replica, or
// before a restart) and no claim decided it (no Redis, or Redis failing):
// the first end recorded wins, as a claim does, and the others, each with
// a reservation of its own rebuilt from the id, answer from it instead of
// ending r again. The ledger, which knows r's end once it is billed, cannot
// tell ends at once. It reports whether this end is the first. The record
// is an ended hold, kept as this replica's own are (see expireHolds).
func (g *Gate) endAlone(r *Reservation, st holdState, c Charge) bool {
	hs := &g.holds
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.find(r.req.ID) != nil {
		return false
	}
	hs.m[r.req.ID] = &hold{tenant: r.req.Caller.Tenant, expires: r.expires, state: st, result: c}
	return true
}

// ended answers for a reservation this replica knows has ended: the first
// settlement's charge (again), or why it cannot be settled. done is false
// while it is open, or when this replica does not hold it.
// endedInLedger tells how held reservation r ended, when this replica has
// no hold of it (h nil: made by another replica, or before a restart) and
// the ledger has its entry final. The claim in Redis says so too, but a
// Redis that lost its data lost the claim, and ending the reservation
// again would refund its limits a second time (a token bucket gives back
// whatever a settlement names). done is false when the ledger does not
// know (no entry, one still open, or no answer within a second): the claim
// decides then.
func (r *Reservation) endedInLedger(ctx context.Context, h *hold) (out Charge, again bool, err error, done bool) {
	if h != nil {
		return Charge{}, false, nil, false
	}
	return r.g.endedInLedger(ctx, r.req.ID, r.expires)
}

// billLookup bounds billClaimed's lookup of the entry it bills.
const billLookup = 10 * time.Second

// ledgerEntry is the entry of request id as the ledger's store holds
// it, asked within within. Until a flush has succeeded since Open
// (g.replayed), it flushes first, within that time, unless the store
// fails meanwhile: Open replays in the background what the spool kept of
// the previous run (reservations made, and ends written, just before a
// restart), and a lookup before the replay took an entry the spool holds
// for none, ended or not. Once one flush succeeded, the store has the
// replay, and a lookup costs what it did.
func (g *Gate) ledgerEntry(ctx context.Context, id string, within time.Duration) (ledger.Entry, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if !g.replayed.Load() {
		if err := g.ledger.FlushUnlessFailing(ctx); err != nil {
			return ledger.Entry{}, false, err
		}
		g.replayed.Store(true)
	}
	return g.ledger.Lookup(ctx, id)
}

// endedInLedger is how the held reservation of request id, which expires
// at expires, ended, as the ledger tells (see Reservation.endedInLedger).
func (g *Gate) endedInLedger(ctx context.Context, id string, expires time.Time) (out Charge, again bool, err error, done bool) {
	e, ok, lerr := g.ledgerEntry(ctx, id, time.Second)
	if lerr != nil || !ok || !e.Status.Final() {
		return Charge{}, false, nil, false
	}
	switch {
	case e.Status == ledger.StatusRecovered && time.Now().Before(expires):
		// Recovered at its estimate by the restart of the replica that
		// made it, before its expiry: nobody ended it. It may still be
		// settled or released until it expires (the claim decides); a
		// settlement recorded beats the recovery in the ledger.
		return Charge{}, false, nil, false
	case e.Status == ledger.StatusExpired || e.Status == ledger.StatusRecovered:
		return Charge{}, false, ErrExpired, true
	case released(e):
		return Charge{}, false, ErrReleased, true
	}
	return Charge{Usage: e.Actual, Cost: e.ActualCost, Model: e.Model, Status: e.Status, HTTPStatus: e.HTTPStatus}, true, nil, true
}

// released tells whether ledger entry e is a release's: failed, at no
// cost, with no HTTP status (Release bills it so). A settlement of a
// failed call is failed too, at $0 as often as not, but with the status
// its caller reported (the reserve API's 502): it is a settlement, which
// a later settle answers and a release may not undo.
func released(e ledger.Entry) bool {
	return e.Status == ledger.StatusFailed && e.HTTPStatus == 0 && e.ActualCost == 0
}

func (g *Gate) ended(h *hold) (out Charge, again bool, err error, done bool) {
	if h == nil {
		return Charge{}, false, nil, false
	}
	g.holds.mu.Lock()
	defer g.holds.mu.Unlock()
	switch h.state {
	case holdSettled:
		return h.result, true, nil, true
	case holdReleased:
		return Charge{}, false, ErrReleased, true
	case holdExpired:
		return Charge{}, false, ErrExpired, true
	}
	return Charge{}, false, nil, false
}

// adopt records on this replica's hold how another replica ended it: a
// hold still open, or marked expired by an expiry here that lost its
// claim (a settlement here that won meanwhile stays). An expiry claimed
// elsewhere (by a resume past it, see endOf) leaves an open hold open:
// this replica's expiry pass settles it at its estimate, which the
// claiming replica leaves to it.
func (g *Gate) adopt(h *hold, c claim) {
	if h == nil {
		return
	}
	g.holds.mu.Lock()
	var res *Reservation
	if h.state == holdOpen && c.state != holdExpired || h.state == holdExpired {
		res = h.res
		h.state, h.result, h.res = c.state, c.charge(), nil
	}
	g.holds.mu.Unlock()
	if res != nil {
		res.endedElsewhere(c)
	}
}

// endedElsewhere lets go of r, held here, which another replica ended as
// c says: what it left unreserved and what it spent from this replica's
// leases are given back, and it is renewed no more. It runs once per
// reservation (adopt takes r from its hold; the expiry pass from its due
// list).
func (r *Reservation) endedElsewhere(c claim) {
	r.unexpose()
	r.giveBackLeased(c)
	r.g.renewer.remove(r)
}

// giveBackLeased gives back to this replica's leases what r, a held
// reservation another replica ended as c says, spent from them beyond its
// end: that replica refunded r's items held in Redis and charged what
// they cost beyond their estimates, but knows nothing of units spent from
// this replica's leases. A release gives back r's whole estimate; a
// settlement what its cost leaves of the estimate on limits and budgets
// counted in dollars (by the claim's cost alone: limits counted in
// tokens stay spent at their estimates, as do a request's count and its
// extra units). An expiry gives back nothing.
func (r *Reservation) giveBackLeased(c claim) {
	l := r.g.leases
	if l == nil || r.degraded || r.ext != nil || len(r.items) == 0 {
		return
	}
	var actual []int64
	switch c.state {
	case holdReleased:
	case holdSettled:
		actual = make([]int64, len(r.items))
		for i, lim := range r.limits {
			actual[i] = r.items[i].Cost
			if lim.extra == 0 && lim.model == "" && lim.unit == "usd" { // another model's share of c.cost is not known: its estimate
				actual[i] = lim.costOf(r.req.Requests, costmodel.Usage{}, c.cost)
			}
		}
	default:
		return
	}
	l.GiveBack(r.resID, r.items, actual)
}

// claim is how a held reservation ended, as replicas record it in Redis.
type claim struct {
	state  holdState
	cost   costmodel.NanoUSD
	status ledger.Status
	// token tells one end's claim from another's: Gate.end draws it, so
	// that a claim found after a call of unknown outcome is known for
	// this end's own or another's. Empty in claims of earlier versions.
	token string
	// billed tells that usage, model and http are the settlement's, as
	// its ledger entry records them, for the replica that adopts the
	// claim to bill it (see billAdopted). False in a release's or an
	// expiry's claim, and in a settlement's of an earlier version.
	billed bool
	usage  costmodel.Usage // without Steps
	model  string
	http   int
}

// settledClaim is the claim of a settlement charged c.
func settledClaim(c Charge) claim {
	u := c.Usage
	u.Steps = nil
	return claim{state: holdSettled, cost: c.Cost, status: c.Status, billed: true, usage: u, model: c.Model, http: c.HTTPStatus}
}

// claimBill is the JSON of a claim's settlement beyond its cost and
// status (see claim.billed).
type claimBill struct {
	Usage  costmodel.Usage `json:"u"`
	Model  string          `json:"m"`
	Status int             `json:"h"`
}

// encode writes c as "STATE COST STATUS TOKEN", an empty status as "-",
// and, when c is billed, " " and a JSON object of its usage, model and
// HTTP status ({"u":{...},"m":"...","h":200}, the model and status left
// out when empty or 0). Earlier versions wrote "STATE COST STATUS
// [TOKEN]" and read the first four fields: they read these too. The
// first four are as fmt.Sprintf("%d %d %s %s") writes them, with one
// allocation, where fmt cost every held reservation's end four.
func (c claim) encode() string {
	status := string(c.status)
	if status == "" {
		status = "-"
	}
	var buf [256]byte
	b := strconv.AppendUint(buf[:0], uint64(c.state), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(c.cost), 10)
	b = append(append(append(b, ' '), status...), ' ')
	b = append(b, c.token...)
	if c.billed {
		b = append(b, ` {"u":`...)
		b = appendUsageJSON(b, &c.usage)
		if c.model != "" {
			b = append(b, `,"m":`...)
			b = appendJSONString(b, c.model)
		}
		if c.http != 0 {
			b = append(b, `,"h":`...)
			b = strconv.AppendInt(b, int64(c.http), 10)
		}
		b = append(b, '}')
	}
	return string(b)
}

// decodeClaim reads a claim encode wrote, or an earlier version's. A
// settlement whose JSON part cannot be read is read without it (not
// billed).
func decodeClaim(v string) (claim, bool) {
	var c claim
	var st uint8
	var status string
	head, bill, hasBill := strings.Cut(v, "{")
	if n, _ := fmt.Sscanf(head, "%d %d %s %s", &st, &c.cost, &status, &c.token); n < 2 || st == 0 || st > uint8(holdExpired) {
		return claim{}, false
	}
	if status == "-" {
		status = ""
	}
	c.state, c.status = holdState(st), ledger.Status(status)
	var cb claimBill
	if hasBill && c.state == holdSettled && json.Unmarshal([]byte("{"+bill), &cb) == nil {
		c.billed, c.usage, c.model, c.http = true, cb.Usage, cb.Model, cb.Status
	}
	return c, true
}

// newClaimToken returns a random token for a claim (see claim.token).
func newClaimToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// charge is the settlement c records: its cost and status, and its
// usage, model and HTTP status when it carries them (billed).
func (c claim) charge() Charge {
	ch := Charge{Cost: c.cost, Status: c.status}
	if c.billed {
		ch.Usage, ch.Model, ch.HTTPStatus = c.usage, c.model, c.http
	}
	return ch
}

func (c claim) answer() (Charge, bool, error) {
	switch c.state {
	case holdReleased:
		return Charge{}, false, ErrReleased
	case holdExpired:
		return Charge{}, false, ErrExpired
	}
	return c.charge(), true, nil
}

// claimGrace is how long a claim outlives its reservation's expiry.
const claimGrace = 10 * time.Minute

// end claims c as how held reservation r ends, as claim does, and, when
// the limiter store can do both in one call (weighted.Claimer: Redis,
// the reservation's items under one hash tag, none from a lease), ends
// r's items in the store with actual (nil cancels) in that same call:
// stored tells so. A claim and its settlement are then one atomic step,
// which a replica that dies between them cannot split, and one round
// trip instead of two. Otherwise the caller ends r's items itself.
//
// When that call fails, its outcome may be unknown: the script may have
// run, or may still run (a call abandoned at the store's CallTimeout is
// carried out up to its ReplyTimeout). The claim is then made on its own
// (claim): the first of the two to reach Redis decides, since the script
// claims and settles only where no claim is. A claim found that is this
// end's own (its token) means the script ran, settlement included. Only
// when Redis cannot be reached at all (its breaker open, or the claim
// failing too) does this replica decide alone.
func (g *Gate) end(ctx context.Context, r *Reservation, c claim, actual []int64) (won bool, prior claim, stored bool, err error) {
	cs, ok := r.store().(weighted.Claimer)
	if g.redis == nil || !ok || r.degraded || r.ext != nil || len(r.items) == 0 {
		won, prior, err = g.claim(ctx, r, c)
		return won, prior, false, err
	}
	c.token = newClaimToken()
	key, ttl := r.claimKey()
	if c.state == holdSettled && r.recorded && c.cost > r.req.Estimate.Cost {
		// Redis claims and charges the settlement in one call, before
		// the ledger bills it (see settle): the entry's estimate is
		// raised to it first, so that the death of the process between
		// the two recovers the entry at what Redis counts, not at the
		// estimate. A claim then lost to another end changes nothing:
		// the first settlement, the other end's when adopted, wins over
		// an estimate. Without this script call, settle bills first.
		// (r.billed is not read: another end of r on this replica,
		// which this one's claim then loses to, may be billing it.)
		r.raiseEstimate(ctx, c.usage, c.cost)
	}
	w, p, err := cs.SettleClaimed(ctx, r.resID, r.items, actual, weighted.Claim{Key: key, Value: c.encode(), TTL: ttl})
	switch {
	case errors.Is(err, errClaimsLost):
		return false, claim{}, false, err // the caller asks the ledger again
	case errors.Is(err, weighted.ErrUnclaimable):
		won, prior, err = g.claim(ctx, r, c)
		return won, prior, false, err
	case errors.Is(err, errBreakerOpen):
		// Redis is taken for down: the outage's rule, this replica
		// decides alone; the store's record of the id keeps a settlement
		// retried by the caller from counting twice.
		g.log.Warn("held reservation: the limiter store is failing; this replica decides alone", "request_id", r.req.ID, "err", err)
		return true, claim{}, false, err
	case err != nil:
		won, prior, cerr := g.claim(ctx, r, c)
		switch {
		case cerr != nil:
			return true, claim{}, false, cerr // claim logged it
		case won:
			return true, claim{}, false, nil
		case prior.token == c.token:
			return true, claim{}, true, nil // the script ran: claimed and settled
		}
		return false, prior, false, nil
	case w:
		return true, claim{}, true, nil
	}
	pc, valid := decodeClaim(p)
	if !valid {
		return true, claim{}, false, fmt.Errorf("gate: held reservation %s: unreadable claim %q", r.req.ID, p)
	}
	return false, pc, false, nil
}

// claimKey is the Redis key that records how held reservation r ended,
// and how long it is kept: until claimGrace past r's expiry.
func (r *Reservation) claimKey() (string, time.Duration) {
	ttl := time.Until(r.expires) + claimGrace
	if r.expires.IsZero() || ttl <= claimGrace {
		ttl = claimGrace
	}
	return heldKey(r.req.Caller.Tenant, r.req.ID), ttl
}

// heldKey is the Redis key of the claim of tenant's held reservation of
// request id.
func heldKey(tenant, id string) string {
	return "{" + tenant + "}:costgate:held:" + id
}

// claim records c as how r ends, unless another replica recorded its end
// first: won is false then, with that end. An error (no Redis, or Redis
// failing) means no claim was made: this replica decides alone.
func (g *Gate) claim(ctx context.Context, r *Reservation, c claim) (won bool, prior claim, err error) {
	if g.redis == nil {
		return true, claim{}, errNoArbiter
	}
	key, ttl := r.claimKey()
	won, prior, err = g.claimAt(ctx, r.req.ID, key, ttl, c)
	if err != nil {
		g.log.Warn("held reservation: the claim in Redis failed; this replica decides alone", "request_id", r.req.ID, "err", err)
		return true, claim{}, err
	}
	return won, prior, nil
}

// claimAt records c under key for ttl unless an end of reservation id is
// recorded there: won is false then, with that end. It makes a SETNX
// and, when another end is there, a GET, bounded by ctx and a second.
func (g *Gate) claimAt(ctx context.Context, id, key string, ttl time.Duration, c claim) (won bool, prior claim, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ok, err := g.redis.SetNX(ctx, key, c.encode(), ttl).Result()
	if err != nil || ok {
		return true, claim{}, err
	}
	v, err := g.redis.Get(ctx, key).Result()
	if err != nil {
		return true, claim{}, err
	}
	p, valid := decodeClaim(v)
	if !valid {
		return true, claim{}, fmt.Errorf("gate: held reservation %s: unreadable claim %q", id, v)
	}
	return false, p, nil
}

var errNoArbiter = errors.New("gate: no shared store to claim held reservations in")

// hold is this replica's hold of r: the one Hold made or Resume found,
// else the one the holds have; nil for none.
func (r *Reservation) hold() *hold {
	if r.held != nil {
		return r.held
	}
	return r.g.hold(r.req.ID)
}

func (g *Gate) hold(id string) *hold {
	g.holds.mu.Lock()
	defer g.holds.mu.Unlock()
	return g.holds.find(id)
}

// unreported is what r is charged when nobody reported its answer (it
// expired): its estimate at its whole output limit, which the request may
// have used whatever output_reserve reserved of it (a percentage below
// 100, or a learned quantile), as the proxy charges a request whose answer
// never came. An estimate without an output limit (a reservation by its
// amounts) is charged as it is.
func (r *Reservation) unreported() costmodel.Estimate {
	est := r.req.Estimate
	if r.learnt != nil && r.learnt.applied {
		est = r.learnt.full
	}
	if est.OutputCap > est.Usage.OutputTokens {
		est.Usage.OutputTokens = est.OutputCap
		est.Cost = max(est.Cost, min(r.st.est.Cost(est.Model, est.Usage), ledger.MaxCost))
	}
	return est
}

// expireHolds settles the open reservations past their expiry (see
// unreported: at their estimate, at their whole output limit) as of now,
// and moves every hold past it to the ended ones,
// where it is kept until at least claimGrace past its expiry. The gate
// runs it every second (see Options).
func (g *Gate) expireHolds(now time.Time) {
	var due []*Reservation
	hs := &g.holds
	hs.mu.Lock()
	if hs.ended[0] == nil || now.Sub(hs.rotated) >= claimGrace {
		hs.ended[1], hs.ended[0], hs.rotated = hs.ended[0], map[string]*hold{}, now
	}
	for id, h := range hs.m {
		if now.Before(h.expires) {
			continue
		}
		if h.state == holdOpen {
			h.state = holdExpired
			due = append(due, h.res) // read here: a settlement that wins its claim drops it
		}
		h.res = nil
		delete(hs.m, id)
		hs.ended[0][id] = h
	}
	hs.mu.Unlock()
	for _, r := range due {
		est := r.unreported()
		ch := Charge{Usage: est.Usage, Cost: est.Cost, Status: ledger.StatusExpired, HTTPStatus: 0, Extra: nil}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		actual := r.actual(ch)
		won, prior, stored, err := g.end(ctx, r, claim{state: holdExpired}, actual)
		if errors.Is(err, errClaimsLost) {
			if out, again, lerr, done := g.endedInLedger(ctx, r.req.ID, r.expires); done {
				cancel()
				// Ended elsewhere, as the ledger, written by every
				// replica, says.
				if c := ledgerClaim(out, again, lerr); c.state != holdExpired {
					g.adopt(r.held, c)
					r.endedElsewhere(c)
				}
				continue
			}
			won, prior, stored, err = g.end(ctx, r, claim{state: holdExpired}, actual)
		}
		// An expiry claimed by a replica that resumed it late (see endOf)
		// is this one: that replica settles nothing, this one settles it.
		if err == nil && !won && prior.state != holdExpired {
			// Settled or released on another replica: the hold tells so
			// from now on, and the ledger, should that replica have died
			// before it wrote the end there.
			g.adopt(r.held, prior)
			r.billAdopted(ctx, prior, nil, true)
			cancel()
			r.endedElsewhere(prior)
			continue
		}
		r.settle(ctx, ch, actual, stored)
		cancel()
		g.log.Info("reservation expired; settled at its estimate", "request_id", r.req.ID, "tenant", r.req.Caller.Tenant)
	}
}

// expireLoop runs expireHolds and the key cap's expiry at intervals of
// every until ctx ends.
func (g *Gate) expireLoop(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			g.expireHolds(now)
			g.keys.expire(now)
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
