package ledger

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// Query selects entries by tenant and creation time, in pages.
type Query struct {
	// Tenant selects one tenant's entries; empty selects every tenant's.
	Tenant string
	// From and To bound CreatedAt to [From, To): To is exclusive. A zero
	// bound is open. ParseRange turns the dates and times a person gives
	// into these bounds.
	From, To time.Time
	// Limit is the most entries of a page: 0 means 100, at most 1000.
	Limit int
	// Cursor continues from a previous page's Next.
	Cursor string
}

// ParseRange returns the bounds [start, end) of Query.From and Query.To for
// the range a person gives as from and to, each one of:
//
//   - a date, YYYY-MM-DD: a whole day in UTC, included. From 2026-03-01 to
//     2026-03-31 is all of March: start is 2026-03-01T00:00:00Z and end
//     2026-04-01T00:00:00Z; from and to the same date is that day;
//   - a time, RFC 3339 with a zone (2026-03-01T12:00:00+01:00): that exact
//     instant, to the microsecond; start is included and end is not, as in
//     Query;
//   - empty: an open bound (a zero time).
//
// It fails with ErrInvalid for any other text, or when the range is
// empty because to is before from.
func ParseRange(from, to string) (start, end time.Time, err error) {
	if start, _, err = parseBound(from); err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("%w from: %v", ErrInvalid, err)
	}
	end, day, err := parseBound(to)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("%w to: %v", ErrInvalid, err)
	}
	if day {
		end = end.AddDate(0, 0, 1)
	}
	// A day to before from's day ends where from starts.
	if !start.IsZero() && !end.IsZero() && (end.Before(start) || day && end.Equal(start)) {
		return time.Time{}, time.Time{}, fmt.Errorf("%w range: to %s is before from %s", ErrInvalid, to, from)
	}
	return start, end, nil
}

// parseBound parses a date (the start of that day in UTC, with day set), an
// RFC 3339 time, or an empty string (a zero time).
func parseBound(s string) (t time.Time, day bool, err error) {
	if s == "" {
		return time.Time{}, false, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, true, nil
	}
	t, err = time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("%q is neither a date (YYYY-MM-DD) nor an RFC 3339 time", s)
	}
	return t.UTC(), false, nil
}

// Page is one page of entries, ordered by CreatedAt then RequestID. Next is
// the cursor of the following page, empty after the last.
type Page struct {
	Entries []Entry
	Next    string
}

// MaxLimit is the largest page Entries returns.
const MaxLimit = 1000

type cursor struct {
	created time.Time
	id      string
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte("v1:" + strconv.FormatInt(c.created.UnixMicro(), 10) + ":" + c.id))
}

func parseCursor(s string) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w cursor: %v", ErrInvalid, err)
	}
	rest, ok := strings.CutPrefix(string(b), "v1:")
	us, id, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || id == "" {
		return nil, fmt.Errorf("%w cursor", ErrInvalid)
	}
	v, err := strconv.ParseInt(us, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w cursor: %v", ErrInvalid, err)
	}
	return &cursor{created: time.UnixMicro(v).UTC(), id: id}, nil
}

// Lookup returns the entry of request id as the store holds it, and
// whether it holds one. Records still in the spool (at most a batch delay
// behind, or the store's outage) are not in it yet.
func (l *Ledger) Lookup(ctx context.Context, id string) (Entry, bool, error) {
	if !ValidText(id) {
		return Entry{}, false, nil // no entry can have it
	}
	return l.store.entry(ctx, id)
}

// Entries returns one page of the entries q selects, as they are in the
// store (call Flush first to include what is still in the spool). It fails
// with ErrInvalid for a tenant that is not valid text (see ValidText),
// which no entry can have.
func (l *Ledger) Entries(ctx context.Context, q Query) (Page, error) {
	if err := checkFilter("query", "tenant", q.Tenant); err != nil {
		return Page{}, err
	}
	if q.Limit < 0 || q.Limit > MaxLimit {
		return Page{}, fmt.Errorf("%w query: limit %d is outside 0..%d", ErrInvalid, q.Limit, MaxLimit)
	}
	if q.Limit == 0 {
		q.Limit = 100
	}
	after, err := parseCursor(q.Cursor)
	if err != nil {
		return Page{}, err
	}
	q.From, q.To = micro(q.From), micro(q.To)
	es, err := l.store.entries(ctx, q, after, q.Limit+1)
	if err != nil {
		return Page{}, err
	}
	var p Page
	if len(es) > q.Limit {
		es = es[:q.Limit]
		last := es[len(es)-1]
		p.Next = cursor{last.CreatedAt, last.RequestID}.String()
	}
	p.Entries = es
	return p, nil
}

// SpendQuery selects the spend of a tenant, or of one of its users or keys,
// over the period that contains At.
type SpendQuery struct {
	Tenant string // required
	User   string // optional: only this user's entries
	KeyID  string // optional: only this key's entries
	// Region, optional, selects the entries recorded in this region (a
	// node's config region). Read from the entries rather than the
	// roll-up, so its cost grows with the tenant's entries in the range:
	// for a rare read (a region's counters restored after a data loss).
	Region string
	// Period is "day" or "month", with boundaries in Config.TimeZone.
	Period string
	// At is a time inside the period; zero means now.
	At time.Time
	// From and To, when To is set, select [From, To) instead of a
	// period. To should be a 15-minute boundary or a time after the last
	// entry: the roll-up counts whole buckets from there on.
	From, To time.Time
}

// checkFilter refuses, with ErrInvalid, a filter value v of a query that no
// entry can have because it is not valid text: a store would fail on it
// (PostgreSQL refuses NUL and invalid UTF-8) and its error would read as
// an outage.
func checkFilter(query, name, v string) error {
	if !ValidText(v) {
		return fmt.Errorf("%w %s: %s is not valid UTF-8 text without NUL of at most %d bytes", ErrInvalid, query, name, maxField)
	}
	return nil
}

// rangeOf returns the bounds of q's range: [From, To) with From rounded
// down to a bucket, or its period.
func (q SpendQuery) rangeOf(now time.Time, tz *time.Location) (from, to time.Time, err error) {
	if q.To.IsZero() {
		at := q.At
		if at.IsZero() {
			at = now
		}
		return Period(q.Period, at, tz)
	}
	from = q.From.UTC()
	if !from.Before(q.To) {
		return time.Time{}, time.Time{}, fmt.Errorf("%w spend query: from %s is not before to %s", ErrInvalid,
			q.From.UTC().Format(time.RFC3339), q.To.UTC().Format(time.RFC3339))
	}
	return from, q.To.UTC(), nil
}

// Period returns the bounds [start, end) of the period named period ("day"
// or "month") that contains at, in the time zone tz.
func Period(period string, at time.Time, tz *time.Location) (start, end time.Time, err error) {
	t := at.In(tz)
	switch period {
	case "day":
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, tz)
		end = start.AddDate(0, 0, 1)
	case "month":
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, tz)
		end = start.AddDate(0, 1, 0)
	default:
		return time.Time{}, time.Time{}, fmt.Errorf("%w period %q: want day or month", ErrInvalid, period)
	}
	return start, end, nil
}

// Spend returns the period-to-date spend q selects: the charge of its
// entries created in the period (the estimate while reserved, the actual
// cost once final), as it is in the store. It reads a roll-up of 15-minute
// buckets, so its cost does not grow with the number of entries.
//
// When the store fails (and ctx is not done), a ledger with a spool answers
// from what this node knows instead: the value and a *LocalSpendError that
// says how it was made (the last value read for the same query and period,
// or over a wider range when there is none, plus this node's records
// spooled since) and wraps the store's error.
// A caller that can use an estimate takes it with errors.As; one that
// cannot treats it as any error. The local answer scans the spool from
// the last read, so its cost grows with the records since.
//
// A sum past the largest int64 answers math.MaxInt64. Spend fails with
// ErrInvalid for a tenant, user, key or region that is not valid text
// (see ValidText), which no entry can have.
func (l *Ledger) Spend(ctx context.Context, q SpendQuery) (costmodel.NanoUSD, error) {
	k, from, to, err := l.keyOf("spend query", q)
	if err != nil {
		return 0, err
	}
	var applied int64
	if l.spool != nil {
		_, applied = l.spool.positions()
	}
	readAt := l.cfg.Now()
	var v costmodel.NanoUSD
	if q.Region != "" {
		v, err = l.regionSpend(ctx, k, from.UTC(), to.UTC())
	} else {
		v, err = l.rangeSpend(ctx, q.Tenant, q.User, q.KeyID, from.UTC(), to.UTC())
	}
	if l.spool == nil {
		return v, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, err
		}
		return l.localSpend(k, err)
	}
	l.answered(readAt)
	l.spendReads.put(k, spendRead{value: v, pos: applied, at: readAt})
	return v, nil
}

// keyOf checks q, a query of the kind what names ("spend query"), and
// returns its key and its range [from, to): ErrInvalid for a query
// without a tenant or with a filter that is not valid text (see
// checkFilter), rangeOf's error for a bad range.
func (l *Ledger) keyOf(what string, q SpendQuery) (k spendQueryKey, from, to time.Time, err error) {
	if q.Tenant == "" {
		return k, from, to, fmt.Errorf("%w %s: tenant is required", ErrInvalid, what)
	}
	return l.anyKeyOf(what, q)
}

// anyKeyOf is keyOf of a query that may name no tenant (every tenant's:
// TotalCountsBy).
func (l *Ledger) anyKeyOf(what string, q SpendQuery) (k spendQueryKey, from, to time.Time, err error) {
	for _, f := range [...]struct{ name, v string }{
		{"tenant", q.Tenant}, {"user", q.User}, {"key id", q.KeyID}, {"region", q.Region},
	} {
		if err := checkFilter(what, f.name, f.v); err != nil {
			return k, from, to, err
		}
	}
	if from, to, err = q.rangeOf(l.cfg.Now(), l.cfg.TimeZone); err != nil {
		return k, from, to, err
	}
	k = spendQueryKey{tenant: q.Tenant, user: q.User, key: q.KeyID, region: q.Region, from: from.UnixMicro(), to: to.UnixMicro()}
	return k, from, to, nil
}

// rangeSpend is the store's spend over [from, to): the entries of a
// bucket that from cuts, then the roll-up's buckets.
func (l *Ledger) rangeSpend(ctx context.Context, tenant, user, key string, from, to time.Time) (costmodel.NanoUSD, error) {
	head, from := splitHead(from, to)
	var v costmodel.NanoUSD
	if !head.IsZero() {
		cs, err := l.store.headSpend(ctx, tenant, head, from)
		if err != nil {
			return 0, err
		}
		for _, c := range cs {
			if (user == "" || c.user == user) && (key == "" || c.key == key) {
				v = addSat(v, c.cost)
			}
		}
	}
	if !from.Before(to) {
		return v, nil
	}
	rest, err := l.store.spend(ctx, tenant, user, key, from, to)
	if err != nil {
		return 0, err
	}
	return addSat(v, rest), nil
}

// regionSpend is the store's spend over [from, to) of the entries that
// match k, a query of one region, read from the entries.
func (l *Ledger) regionSpend(ctx context.Context, k spendQueryKey, from, to time.Time) (costmodel.NanoUSD, error) {
	cs, err := l.store.headSpend(ctx, k.tenant, from, to)
	if err != nil {
		return 0, err
	}
	var v costmodel.NanoUSD
	for _, c := range cs {
		if c.region == k.region && (k.user == "" || c.user == k.user) && (k.key == "" || c.key == k.key) {
			v = addSat(v, c.cost)
		}
	}
	return v, nil
}

// splitHead splits [from, to) where from cuts a roll-up bucket: head is
// from, and rest the next bucket's start (or to); head is zero when from
// is a bucket's start.
func splitHead(from, to time.Time) (head, rest time.Time) {
	start := from.Truncate(bucketSize)
	if start.Equal(from) {
		return time.Time{}, from
	}
	next := start.Add(bucketSize)
	if to.Before(next) {
		next = to
	}
	return from, next
}

// headCharge is the charge of a tenant's entries of one user, key and
// region.
type headCharge struct {
	user, key, region string
	cost              costmodel.NanoUSD
}

// TenantSpend is one tenant's spend over a period.
type TenantSpend struct {
	Tenant  string            `json:"tenant"`
	Spend   costmodel.NanoUSD `json:"spend_nanousd"`
	Entries int64             `json:"entries"` // entries created in the period
}

// TotalSpend returns the spend of every tenant together over the entries
// created in [from, to): from rounded down to the roll-up's 15-minute
// buckets (so it may count up to 15 minutes more), to a bucket's start or
// a time after the last entry. It reads the roll-up, one row per tenant
// and bucket; the sum saturates.
func (l *Ledger) TotalSpend(ctx context.Context, from, to time.Time) (costmodel.NanoUSD, error) {
	from = from.UTC().Truncate(bucketSize)
	if !from.Before(to) {
		return 0, fmt.Errorf("%w total spend: from %s is not before to %s", ErrInvalid, from.Format(time.RFC3339), to.UTC().Format(time.RFC3339))
	}
	ts, err := l.store.summary(ctx, from, to.UTC())
	if err != nil {
		return 0, err
	}
	var v costmodel.NanoUSD
	for _, t := range ts {
		v = addSat(v, t.Spend)
	}
	return v, nil
}

// Summary returns the spend of every tenant with entries in the period
// ("day" or "month", in Config.TimeZone) that contains at (zero: now),
// ordered by tenant, as it is in the store. It reads the same roll-up as
// Spend; a limiter that keeps spend counters reconciles them from it.
func (l *Ledger) Summary(ctx context.Context, period string, at time.Time) ([]TenantSpend, error) {
	if at.IsZero() {
		at = l.cfg.Now()
	}
	from, to, err := Period(period, at, l.cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	return l.store.summary(ctx, from.UTC(), to.UTC())
}
