package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// KeySpend returns the spend of each key of tenant, by key id, over
// [from, to): the charge of its entries created in the range, as it is in
// the store, in one read of the roll-up; a key with entries there is
// present, at 0 when they cost nothing, and one without is absent; the
// entries that name no key are left out. To should be a 15-minute boundary or a time after the last entry (see
// SpendQuery). A limiter sums it over the keys of a team, a user or one
// key.
//
// When the store fails (and ctx is not done), a ledger with a spool answers
// as Spend does: the last values read for the same tenant and range plus
// this node's records spooled since, with a *LocalSpendError whose Spend
// is their sum and whose PendingOf tells each value's part spooled since.
//
// A key's sum past the largest int64 answers math.MaxInt64. KeySpend
// fails with ErrInvalid for a tenant that is not valid text (see
// ValidText).
func (l *Ledger) KeySpend(ctx context.Context, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	return l.spendBy(ctx, keyScope, tenant, from, to)
}

// UserSpend is KeySpend by user rather than by key: the spend of each user
// of tenant over [from, to), in one read of the roll-up: a user with
// entries there is present, at 0 when they cost nothing, and one without
// is absent; the entries that name no user are under "". A limiter
// that lost its counters finds with it the users a tenant's budgets
// counted, whoever named them. While the store fails it answers as
// KeySpend does.
func (l *Ledger) UserSpend(ctx context.Context, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	return l.spendBy(ctx, userScope, tenant, from, to)
}

// spendBy is KeySpend (by keyScope) and UserSpend (by userScope).
func (l *Ledger) spendBy(ctx context.Context, by, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	query := scopeQuery[by]
	if tenant == "" {
		return nil, fmt.Errorf("%w %s: tenant is required", ErrInvalid, query)
	}
	if err := checkFilter(query, "tenant", tenant); err != nil {
		return nil, err
	}
	from, to, err := SpendQuery{From: from, To: to}.rangeOf(time.Time{}, time.UTC)
	if err != nil {
		return nil, err
	}
	k := spendQueryKey{tenant: tenant, from: from.UnixMicro(), to: to.UnixMicro()}
	if by == userScope {
		k.user = "\x00each"
	} else {
		k.key = "\x00each"
	}
	var applied int64
	if l.spool != nil {
		_, applied = l.spool.positions()
	}
	readAt := l.cfg.Now()
	v, err := l.rangeSpendBy(ctx, by, tenant, from, to)
	if l.spool == nil {
		return v, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return l.localSpendBy(by, k, err)
	}
	l.answered(readAt)
	l.keyReads.put(k, keySpendRead{values: v, pos: applied, at: readAt})
	return v, nil
}

// rangeSpendBy is spendBy's read of the store: the entries of a bucket
// that from cuts, then the roll-up's buckets.
func (l *Ledger) rangeSpendBy(ctx context.Context, by, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	head, from := splitHead(from, to)
	out := map[string]costmodel.NanoUSD{}
	if from.Before(to) {
		var err error
		if out, err = l.store.scopeSpend(ctx, tenant, by, from, to); err != nil {
			return nil, err
		}
	}
	if !head.IsZero() {
		cs, err := l.store.headSpend(ctx, tenant, head, from)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			if by == userScope {
				out[c.user] = addSat(out[c.user], c.cost)
			} else if c.key != "" {
				out[c.key] = addSat(out[c.key], c.cost)
			}
		}
	}
	return out, nil
}

// keySpendRead is spendBy's last read of a tenant and range.
type keySpendRead struct {
	values map[string]costmodel.NanoUSD
	pos    int64
	at     time.Time
}

// localSpendBy answers k, a read by by, from its last read and the spool
// after it.
func (l *Ledger) localSpendBy(by string, k spendQueryKey, storeErr error) (map[string]costmodel.NanoUSD, error) {
	last, ok := l.keyReads.last(k, l.answeredAfter(k.from))
	from, partial := l.pendingFrom(last.pos, ok)
	out := make(map[string]costmodel.NanoUSD, len(last.values))
	pendingBy := map[string]costmodel.NanoUSD{}
	le := &LocalSpendError{ReadAt: last.at, Partial: partial, Unknown: !ok && l.answeredAfter(k.from), Err: storeErr, pendingBy: &pendingBy}
	for id, v := range last.values {
		out[id] = v
		le.Stored = addSat(le.Stored, v)
	}
	whole := spendQueryKey{tenant: k.tenant, from: k.from, to: k.to}
	err := l.pendingEach(from, maxPosition, whole.match, func(w cols, c charge) {
		d := c.cost
		id := w.keyID
		if by == userScope {
			id = w.user
		} else if id == "" {
			return // as the store's answer: no key, no key's spend
		}
		out[id] = addSat(out[id], d)
		pendingBy[id] = addSat(pendingBy[id], d)
		le.Pending = addSat(le.Pending, d)
	})
	if err != nil {
		return nil, fmt.Errorf("%w (and the spool: %v)", storeErr, err)
	}
	le.Spend = addSat(le.Stored, le.Pending)
	return out, le
}

// keyScope and userScope are the roll-up's scope prefixes of one key's
// and one user's spend (see scopeOf).
const (
	keyScope  = "k:"
	userScope = "u:"
)

// scopeQuery names spendBy's query of each scope prefix in its errors.
var scopeQuery = map[string]string{keyScope: "key spend query", userScope: "user spend query"}

// rows is a query's result as both stores' drivers return it.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanScopeSpend turns roll-up rows (scope, cost) of scopes that start
// with prefix into spend by the scope's rest (a key id, a user); with
// halves, a row's cost is two columns, the sums of its high and low
// halves (sqliteSumCost).
func scanScopeSpend(rs rows, prefix string, halves bool) (map[string]costmodel.NanoUSD, error) {
	out := map[string]costmodel.NanoUSD{}
	for rs.Next() {
		var scope string
		cost, err := scanCost(rs, halves, &scope)
		if err != nil {
			return nil, err
		}
		id, ok := strings.CutPrefix(scope, prefix)
		if !ok {
			return nil, errors.New("a row of another scope")
		}
		out[id] = addSat(out[id], costmodel.NanoUSD(cost))
	}
	return out, rs.Err()
}

// scanHeadCharges reads rows (user, key, region, cost) of entries'
// charges, the cost as scanKeySpend reads it.
func scanHeadCharges(rs rows, halves bool) ([]headCharge, error) {
	var out []headCharge
	for rs.Next() {
		var c headCharge
		cost, err := scanCost(rs, halves, &c.user, &c.key, &c.region)
		if err != nil {
			return nil, err
		}
		c.cost = costmodel.NanoUSD(cost)
		out = append(out, c)
	}
	return out, rs.Err()
}

// scanCost scans the current row into dest followed by a cost: one column,
// or with halves the two columns of sqliteSumCost, joined.
func scanCost(rs rows, halves bool, dest ...any) (int64, error) {
	var hi, lo int64
	if halves {
		if err := rs.Scan(append(dest, &hi, &lo)...); err != nil {
			return 0, err
		}
		return joinHalves(hi, lo), nil
	}
	if err := rs.Scan(append(dest, &lo)...); err != nil {
		return 0, err
	}
	return lo, nil
}
