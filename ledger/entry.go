package ledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/costmodel"
)

// Status is where an entry stands in its life.
type Status string

const (
	// StatusReserved is an admitted request whose response has not been
	// settled yet. It counts towards spend at its estimate.
	StatusReserved Status = "reserved"
	// StatusSettled is a request finalized with the usage the upstream
	// reported; it is charged ActualCost.
	StatusSettled Status = "settled"
	// StatusRecovered is a request whose process died in flight. It was
	// finalized at recovery and is charged at its estimate (Actual =
	// Estimated).
	StatusRecovered Status = "recovered"
	// StatusFailed is a request the upstream answered with an error; it is
	// charged what the upstream reported, usually zero.
	StatusFailed Status = "failed"
	// StatusExpired is a reservation taken through the reserve/settle API
	// that was neither settled nor released before it expired; it is
	// charged at its estimate (Actual = Estimated).
	StatusExpired Status = "expired"
)

// Final reports whether s is a terminal status.
func (s Status) Final() bool {
	return s == StatusSettled || s == StatusRecovered || s == StatusFailed || s == StatusExpired
}

func (s Status) valid() bool {
	return s == StatusReserved || s.Final()
}

func negative(t costmodel.Usage) bool {
	return t.InputTokens < 0 || t.CachedInputTokens < 0 || t.CacheWriteTokens < 0 ||
		t.OutputTokens < 0 || t.ReasoningTokens < 0 || t.Units < 0 ||
		t.CacheWrite1hTokens < 0 || t.AudioInputTokens < 0 || t.AudioOutputTokens < 0 ||
		t.WebSearchRequests < 0 || t.FileSearchCalls < 0 || t.ContainerGB < 0
}

// Entry is the ledger's record of one admitted request. RequestID is the
// idempotency key: a store never holds two entries with the same RequestID.
type Entry struct {
	RequestID string `json:"request_id"`

	Tenant   string `json:"tenant"`
	User     string `json:"user"`
	KeyID    string `json:"key_id"`
	Route    string `json:"route"`
	Upstream string `json:"upstream"`
	Model    string `json:"model"`
	Region   string `json:"region"`
	// KeyModel and KeyRoute are the model and the route the limiter
	// keyed the request's counters by (its limits keyed by model or
	// route), when they are not Model and Route: the model asked for
	// (by its canonical name) when a downgrade served another (an alias
	// of it needs none: a limiter keys by the canonical name of Model),
	// the API's route when the caller named the request
	// (the reserve API's route). Empty: Model and Route. A settlement
	// that names a model (a route) names its key model (key route) with
	// it. A limiter that lost its counters restores those of its limits
	// keyed by model or route from them (see CountsBy).
	KeyModel string `json:"key_model,omitempty"`
	KeyRoute string `json:"key_route,omitempty"`
	// Plan is the plan of the caller the limiter decided the request for
	// (the plan its limits were chosen by) at the decision, set by the
	// reservation. Empty: not known (an entry written before the ledger
	// kept it, or a caller without a plan), which counts on every limit
	// of some plans (see GroupBy.Plan).
	Plan string `json:"plan,omitempty"`
	// KeyIP and KeyAttrs are what the limiter's keys held of the
	// request's client address and custom attributes, set by the
	// reservation when some limit is keyed by them: KeyIP the address as
	// the keys write it (an IPv6 address's /64, escaped, a long one
	// hashed), KeyAttrs the attributes the limits name, each written
	// "name=value" as the keys write it, sorted by name and joined by ':'
	// (no written value holds ':' or '='). A byte the keys hold that is
	// not UTF-8 text (or NUL) is written %XX, which no written value
	// holds otherwise (see gate's writeKeyValue). Empty: no limit keyed
	// the request by them, or an entry written before the ledger kept
	// them (see GroupBy.IP).
	KeyIP    string `json:"key_ip,omitempty"`
	KeyAttrs string `json:"key_attrs,omitempty"`
	// KeyDesc is what a front door's own limits (the rate limit service's
	// descriptor limits, gate.Extra) counted of the request, set by the
	// reservation: one line per counter, as the gate writes it (its
	// limit, its key and the amount counted, see gate's descKeys), valid
	// UTF-8 text of at most MaxKeyDesc bytes. Empty: no such limit counted
	// the request, or an entry written before the ledger kept them (see
	// GroupBy.Desc).
	KeyDesc string `json:"key_desc,omitempty"`

	Decision string `json:"decision"`
	Policy   string `json:"policy"`
	Friction string `json:"friction"`

	Status     Status `json:"status"`
	HTTPStatus int    `json:"http_status"`
	// Requests is how many requests the limiter counted the entry for
	// on its limits in requests: 1 for a proxied request, the hits an
	// RLS debit took, the reserve API's requests, 0 for a charge of
	// usage already served (the RLS server's report of a stream's
	// tokens). The zero value counts none. An entry stored before the
	// ledger kept it reads as 1.
	Requests int64 `json:"requests"`

	Estimated     costmodel.Usage   `json:"estimated"`
	Actual        costmodel.Usage   `json:"actual"`
	EstimatedCost costmodel.NanoUSD `json:"estimated_cost_nanousd"`
	ActualCost    costmodel.NanoUSD `json:"actual_cost_nanousd"`

	// CreatedAt is when the request was reserved; SettledAt when it was
	// finalized (zero while reserved).
	CreatedAt time.Time `json:"created_at"`
	SettledAt time.Time `json:"settled_at,omitzero"`
}

// Charge is what e counts for in spend and billing: the estimate while
// reserved, the actual cost once final.
func (e *Entry) Charge() costmodel.NanoUSD {
	if e.Status == StatusReserved {
		return e.EstimatedCost
	}
	return e.ActualCost
}

// ErrInvalid reports an entry or query that the ledger refuses.
var ErrInvalid = errors.New("ledger: invalid")

// MaxCost is the largest cost of one entry, 2^53 nano-USD (about $9
// million). Reserve refuses an EstimatedCost above it with ErrInvalid; a
// settlement whose ActualCost (or EstimatedCost) is above it is recorded,
// and charged, at MaxCost. The bound keeps a roll-up bucket exact up to
// 1,024 entries at MaxCost, so that an absurd estimate or usage does not
// saturate the tenant's spend and a later settlement does not take other
// entries' spend away with it.
const MaxCost costmodel.NanoUSD = 1 << 53

// boundCost returns c, or MaxCost when c is above it.
func boundCost(c costmodel.NanoUSD) costmodel.NanoUSD {
	return min(c, MaxCost)
}

// maxField bounds every string field, so that a record stays small.
const maxField = 4096

// MaxKeyAttrs bounds an entry's KeyAttrs: 16 attributes written at
// their longest (see gate's writeKeyValue: about a kilobyte each) and
// more of the usual length.
const MaxKeyAttrs = 4 * maxField

// MaxKeyDesc bounds an entry's KeyDesc: a dozen descriptor counters with
// keys at their longest, more of the usual length.
const MaxKeyDesc = 4 * maxField

// MaxKeyField bounds the fields PostgreSQL indexes (request id; tenant and
// request id; tenant, user and key in the spend roll-up): a B-tree key
// must fit in about 2,700 bytes, and a row the store refused would stop
// the flusher for every tenant.
const MaxKeyField = 512

// ValidText tells whether s can be a string field of an entry: valid
// UTF-8 without NUL (PostgreSQL text holds neither; an entry the store
// refused would stop the flusher, so the ledger refuses it first), of at
// most 4,096 bytes.
func ValidText(s string) bool {
	return len(s) <= maxField && utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// ValidKeyText tells whether s can be a field of an entry of at most
// MaxKeyField bytes (a tenant, user or key id; and a name configured once
// that every entry of its requests records, such as a plan or a region).
func ValidKeyText(s string) bool {
	return len(s) <= MaxKeyField && ValidText(s)
}

func (e *Entry) check() error {
	if e.RequestID == "" {
		return fmt.Errorf("%w entry: empty request id", ErrInvalid)
	}
	if strings.HasPrefix(e.RequestID, tickEntryPrefix) {
		// The ledger's own: a tick's entries (see openSpool).
		return fmt.Errorf("%w entry %q: a request id starting with %q is the ledger's own", ErrInvalid, e.RequestID, tickEntryPrefix)
	}
	for _, f := range [...]struct {
		name, v string
		max     int
	}{
		{"request id", e.RequestID, MaxKeyField}, {"tenant", e.Tenant, MaxKeyField}, {"user", e.User, MaxKeyField},
		{"key id", e.KeyID, MaxKeyField}, {"route", e.Route, maxField}, {"upstream", e.Upstream, maxField},
		{"model", e.Model, maxField}, {"region", e.Region, maxField}, {"decision", e.Decision, maxField},
		{"key model", e.KeyModel, maxField}, {"key route", e.KeyRoute, maxField}, {"plan", e.Plan, maxField},
		{"policy", e.Policy, maxField}, {"friction", e.Friction, maxField},
		{"key ip", e.KeyIP, maxField}, {"key attrs", e.KeyAttrs, MaxKeyAttrs}, {"key desc", e.KeyDesc, MaxKeyDesc},
	} {
		if len(f.v) > f.max {
			return fmt.Errorf("%w entry %q: %s longer than %d bytes", ErrInvalid, e.RequestID, f.name, f.max)
		}
		if !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%w entry %q: %s is not valid UTF-8 text", ErrInvalid, e.RequestID, f.name)
		}
	}
	if negative(e.Estimated) || negative(e.Actual) || e.EstimatedCost < 0 || e.ActualCost < 0 {
		return fmt.Errorf("%w entry %q: negative usage or cost", ErrInvalid, e.RequestID)
	}
	if e.Requests < 0 {
		return fmt.Errorf("%w entry %q: negative requests", ErrInvalid, e.RequestID)
	}
	if e.HTTPStatus < 0 || e.HTTPStatus > 999 {
		return fmt.Errorf("%w entry %q: HTTP status %d", ErrInvalid, e.RequestID, e.HTTPStatus)
	}
	for _, t := range [...]time.Time{e.CreatedAt, e.SettledAt} {
		// The spool writes a zero time as 0 µs, so the epoch itself, to
		// the microsecond, would come back as no time at all. The year is
		// the stored one, in UTC: JSON writes no year past 9999.
		if !t.IsZero() && (t.UnixMicro() <= 0 || t.UTC().Year() > 9999) {
			return fmt.Errorf("%w entry %q: time %s not after 1970-01-01 or past the year 9999", ErrInvalid, e.RequestID, t)
		}
	}
	return nil
}

// micro is the precision of every stored time.
func micro(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Truncate(time.Microsecond).UTC()
}
