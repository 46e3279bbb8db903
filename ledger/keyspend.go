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
// the store, in one read of the roll-up; keys without spend are absent.
// To should be a 15-minute boundary or a time after the last entry (see
// SpendQuery). A limiter sums it over the keys of a team, a user or one
// key.
//
// When the store fails (and ctx is not done), a ledger with a spool answers
// as Spend does: the last values read for the same tenant and range plus
// this node's records spooled since, with a *LocalSpendError whose Spend
// is their sum.
//
// A key's sum past the largest int64 answers math.MaxInt64. KeySpend
// fails with ErrInvalid for a tenant that is not valid text (see
// ValidText).
func (l *Ledger) KeySpend(ctx context.Context, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	if tenant == "" {
		return nil, fmt.Errorf("%w key spend query: tenant is required", ErrInvalid)
	}
	if err := checkFilter("key spend query", "tenant", tenant); err != nil {
		return nil, err
	}
	from, to, err := SpendQuery{From: from, To: to}.rangeOf(time.Time{}, time.UTC)
	if err != nil {
		return nil, err
	}
	k := spendQueryKey{tenant: tenant, key: "\x00each", from: from.UnixMicro(), to: to.UnixMicro()}
	var applied int64
	if l.spool != nil {
		_, applied = l.spool.positions()
	}
	readAt := l.cfg.Now()
	v, err := l.rangeKeySpend(ctx, tenant, from, to)
	if l.spool == nil {
		return v, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return l.localKeySpend(k, err)
	}
	l.keyReads.put(k, keySpendRead{values: v, pos: applied, at: readAt})
	return v, nil
}

// rangeKeySpend is KeySpend's read of the store: the entries of a bucket
// that from cuts, then the roll-up's buckets.
func (l *Ledger) rangeKeySpend(ctx context.Context, tenant string, from, to time.Time) (map[string]costmodel.NanoUSD, error) {
	head, from := splitHead(from, to)
	out := map[string]costmodel.NanoUSD{}
	if from.Before(to) {
		var err error
		if out, err = l.store.keySpend(ctx, tenant, from, to); err != nil {
			return nil, err
		}
	}
	if !head.IsZero() {
		cs, err := l.store.headSpend(ctx, tenant, head, from)
		if err != nil {
			return nil, err
		}
		for _, c := range cs {
			if c.key != "" {
				out[c.key] = addSat(out[c.key], c.cost)
			}
		}
	}
	return out, nil
}

// keySpendRead is KeySpend's last read of a tenant and range.
type keySpendRead struct {
	values map[string]costmodel.NanoUSD
	pos    int64
	at     time.Time
}

// localKeySpend answers k from its last read and the spool after it.
func (l *Ledger) localKeySpend(k spendQueryKey, storeErr error) (map[string]costmodel.NanoUSD, error) {
	last, ok := l.keyReads.get(k)
	from, partial := l.pendingFrom(last.pos, ok)
	out := make(map[string]costmodel.NanoUSD, len(last.values))
	le := &LocalSpendError{ReadAt: last.at, Partial: partial, Err: storeErr}
	for id, v := range last.values {
		out[id] = v
		le.Stored = addSat(le.Stored, v)
	}
	whole := spendQueryKey{tenant: k.tenant, from: k.from, to: k.to}
	err := l.pendingEach(from, whole.match, func(keyID string, d costmodel.NanoUSD) {
		out[keyID] = addSat(out[keyID], d)
		le.Pending = addSat(le.Pending, d)
	})
	if err != nil {
		return nil, fmt.Errorf("%w (and the spool: %v)", storeErr, err)
	}
	le.Spend = addSat(le.Stored, le.Pending)
	return out, le
}

// keyScope is the roll-up's scope prefix of one key's spend.
const keyScope = "k:"

// rows is a query's result as both stores' drivers return it.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanKeySpend turns roll-up rows (scope, cost) of key scopes into spend by
// key id; with halves, a row's cost is two columns, the sums of its high
// and low halves (sqliteSumCost).
func scanKeySpend(rs rows, halves bool) (map[string]costmodel.NanoUSD, error) {
	out := map[string]costmodel.NanoUSD{}
	for rs.Next() {
		var scope string
		cost, err := scanCost(rs, halves, &scope)
		if err != nil {
			return nil, err
		}
		id, ok := strings.CutPrefix(scope, keyScope)
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
