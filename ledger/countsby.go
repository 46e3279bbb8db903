package ledger

// CountsBy is Counts and the charge of a tenant's entries, grouped by
// columns besides the caller (route, upstream, model, region): a limiter
// that lost the counters of limits keyed by those restores each from its
// group, in one read of the tenant's entries in the window rather than
// one read per value. TotalCountsBy is the same of every tenant's
// entries together, for the limits of a whole deployment.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// GroupBy names the columns CountsBy groups entries by. The zero value
// groups by none: one group of every entry the query selects.
//
// Plan groups by the plan an entry records (Entry.Plan), for a limit of
// some plans: an entry of the empty plan (not known) counts on every
// such limit. IP and Attrs group by what the limiter's keys held of the
// client address and the attributes (Entry.KeyIP, Entry.KeyAttrs), for
// limits keyed by them: an entry stored before the ledger kept them is
// in the group of the empty ones, which a limiter cannot put on any
// counter of such a limit.
//
// Desc groups by the descriptor counters an entry records
// (Entry.KeyDesc), for a front door's own limits, and selects only the
// entries that record some: a group's Entries times each counter's
// amount its KeyDesc states is what the group counted on that counter.
// It counts this node's tallies (Ledger.Tally) at once: those not yet
// ticked into entries as pending entries of their aggregates.
type GroupBy struct {
	User, KeyID, Route, Upstream, Model, Region, Plan, IP, Attrs, Desc bool
}

// cols are the columns of an entry that CountsBy can group by.
type cols struct {
	user, keyID, route, upstream, model, region, plan, ip, attrs, desc string
}

// colsOf is e's columns as CountsBy groups them: its route and model are
// those the limiter keyed it by (see Entry.KeyModel); its region is the
// limiter's, which keys a limit by the region it records.
func colsOf(e *Entry) cols {
	return cols{e.User, e.KeyID, cmp.Or(e.KeyRoute, e.Route), e.Upstream, cmp.Or(e.KeyModel, e.Model), e.Region, e.Plan, e.KeyIP, e.KeyAttrs, e.KeyDesc}
}

// of is c with the columns by does not group by emptied: its group.
func (by GroupBy) of(c cols) cols {
	pick := func(on bool, v string) string {
		if on {
			return v
		}
		return ""
	}
	return cols{pick(by.User, c.user), pick(by.KeyID, c.keyID), pick(by.Route, c.route),
		pick(by.Upstream, c.upstream), pick(by.Model, c.model), pick(by.Region, c.region), pick(by.Plan, c.plan),
		pick(by.IP, c.ip), pick(by.Attrs, c.attrs), pick(by.Desc, c.desc)}
}

// columns are the store's columns of by, in the order of cols: a column
// by does not group by is the empty text (blank, as the store spells it).
func (by GroupBy) columns(blank string) (selected, grouped []string) {
	for _, c := range [...]struct {
		on   bool
		name string
	}{{by.User, "user_id"}, {by.KeyID, "key_id"}, {by.Route, keyedRoute}, {by.Upstream, "upstream"}, {by.Model, keyedModel}, {by.Region, "region"}, {by.Plan, "plan"},
		{by.IP, "key_ip"}, {by.Attrs, "key_attrs"}, {by.Desc, "key_desc"}} {
		if c.on {
			selected, grouped = append(selected, c.name), append(grouped, c.name)
		} else {
			selected = append(selected, blank)
		}
	}
	return selected, grouped
}

// descOnly is the condition of a grouped read by the descriptor
// counters (GroupBy.Desc): the entries that record some, "" otherwise;
// followed by AND.
func (by GroupBy) descOnly() string {
	if !by.Desc {
		return ""
	}
	return `key_desc <> '' AND `
}

// keyedRoute and keyedModel are the route and the model the limiter keyed
// an entry by (see Entry.KeyModel), as the stores read them.
const (
	keyedRoute = `(CASE WHEN key_route <> '' THEN key_route ELSE route END)`
	keyedModel = `(CASE WHEN key_model <> '' THEN key_model ELSE model END)`
)

// groupClause is the GROUP BY clause of grouped columns ("" for none).
func groupClause(grouped []string) string {
	if len(grouped) == 0 {
		return ""
	}
	return " GROUP BY " + strings.Join(grouped, ", ")
}

// counted is expr, one of countsRequest, countsInput and countsOutput,
// for a row of a counted decision (see countedDecision), else 0.
func counted(expr string) string {
	return `(CASE WHEN ` + countsDecisions + ` THEN ` + expr + ` ELSE 0 END)`
}

// Group is one group of entries in CountsBy's answer.
type Group struct {
	// User, KeyID, Route, Upstream, Model, Region, Plan, KeyIP and
	// KeyAttrs are the group's values of the columns CountsBy grouped by;
	// empty for the others.
	User, KeyID, Route, Upstream, Model, Region, Plan, KeyIP, KeyAttrs, KeyDesc string
	// Entries is how many of the group's entries count on a limiter: of
	// an admitted decision, and not failed without an HTTP status (see
	// Entry.Counts), saturating.
	Entries int64
	// PendingEntries is, in an answer from this node's records, the part
	// of Entries from the records spooled after the last read (see
	// PendingCounts); in the store's answer, the aggregates of this node's
	// tallies not yet ticked (see Ledger.Tally) that a grouped read by
	// Desc adds, zero otherwise.
	PendingEntries int64
	// Counts is what the group's entries counted on a limiter (see
	// Entry.Counts).
	Counts Counts
	// Charge is the group's charge in nano-dollars, as Spend counts it
	// (Entry.Charge, whatever the decision), saturating.
	Charge costmodel.NanoUSD
	// PendingCounts and PendingCharge are, in an answer from this node's
	// records (with a *LocalSpendError), the part of Counts and Charge
	// from the records spooled after the last read (see
	// LocalSpendError.Pending); zero in the store's answer.
	PendingCounts Counts
	PendingCharge costmodel.NanoUSD
}

func (g *Group) cols() cols {
	return cols{g.User, g.KeyID, g.Route, g.Upstream, g.Model, g.Region, g.Plan, g.KeyIP, g.KeyAttrs, g.KeyDesc}
}

// MaxGroups bounds the groups of one CountsBy answer.
const MaxGroups = 16384

// groupsRead is CountsBy's last read of a query.
type groupsRead struct {
	groups []Group
	pos    int64
	at     time.Time
}

// CountsBy returns what the entries q selects (its tenant, and its user,
// key and region when set, over its period or [From, To) exactly)
// counted on a limiter and were charged, grouped by the columns by
// names: one Group per distinct value of those columns among the
// entries, those with entries that count nothing too. It reads the
// tenant's entries in the range once (an index range scan, as Counts
// does), so its cost grows with them: it is for a rare read, the
// counters of a tenant's limits keyed by route, upstream, model or region
// restored after the limiter's store lost its data. The groups come
// most requests first; past MaxGroups, the groups of the fewest
// requests are left out.
//
// When the store fails (and ctx is not done), a ledger with a spool
// answers as Counts does: the last groups read for the same query plus
// this node's records spooled since (each group's part of them in its
// PendingCounts and PendingCharge), with a *LocalSpendError whose
// Unknown says the store's part is not known (its other values are
// zero).
//
// CountsBy fails as Counts does for a bad query.
func (l *Ledger) CountsBy(ctx context.Context, q SpendQuery, by GroupBy) ([]Group, error) {
	k, from, to, err := l.keyOf("counts query", q)
	if err != nil {
		return nil, err
	}
	return l.countsBy(ctx, k, from, to, by)
}

// TotalCountsBy is CountsBy of every tenant's entries together: what the
// entries created over q's period or [From, To) exactly (in q's region
// when set) counted on a limiter and were charged, grouped by the
// columns by names. It reads every entry in the range once (an index
// range scan by creation time), so its cost grows with the deployment's
// entries in the range: it is for a rare read, the counters of the
// limits of a whole deployment (keyed by model, route, upstream,
// address, attributes or nothing) restored after the limiter's store
// lost its data. It answers as CountsBy does while the store fails, from
// this node's records.
//
// TotalCountsBy fails with ErrInvalid for a query that names a tenant,
// a user or a key (CountsBy's), a region that is not valid text (see
// ValidText), and as Spend does for a bad range.
func (l *Ledger) TotalCountsBy(ctx context.Context, q SpendQuery, by GroupBy) ([]Group, error) {
	if q.Tenant != "" || q.User != "" || q.KeyID != "" {
		return nil, fmt.Errorf("%w total counts query: a tenant, user or key is CountsBy's", ErrInvalid)
	}
	k, from, to, err := l.anyKeyOf("total counts query", q)
	if err != nil {
		return nil, err
	}
	return l.countsBy(ctx, k, from, to, by)
}

// countsBy answers CountsBy's and TotalCountsBy's query k over [from,
// to), grouped by by.
func (l *Ledger) countsBy(ctx context.Context, k spendQueryKey, from, to time.Time, by GroupBy) ([]Group, error) {
	k.by = by
	from, to = micro(from), micro(to)
	var applied int64
	if l.spool != nil {
		_, applied = l.spool.positions()
	}
	readAt := l.cfg.Now()
	var (
		gs      []Group
		err     error
		tallies []Entry
	)
	// The aggregates not yet ticked are not in the store: added to its
	// answer as this node's pending entries. Read before the store, they
	// are in neither twice unless a tick swapped them out meanwhile, whose
	// entries the store may then hold: read again.
	for try := 0; ; try++ {
		var gen uint64
		if k.by.Desc && l.spool != nil {
			tallies, gen = l.pendingTallies(k.matchBy())
		}
		gs, err = l.store.countsBy(ctx, k, from, to, MaxGroups)
		if err != nil || len(tallies) == 0 || l.tallyGen() == gen || try == 2 {
			break // after three tries, counted twice rather than not at all
		}
	}
	if err == nil {
		sortGroups(gs)
	}
	if l.spool == nil {
		return gs, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return l.localCountsBy(k, err)
	}
	l.answered(readAt)
	l.groupReads.put(k, groupsRead{groups: gs, pos: applied, at: readAt})
	gs = slices.Clone(gs)
	if len(tallies) > 0 {
		gs = addPending(gs, k.by, tallies, nil)
	}
	return gs, nil
}

// groupAdder adds pending changes to groups, as localCountsBy and the
// aggregates not yet ticked do.
type groupAdder struct {
	by  GroupBy
	out []Group
	at  map[cols]int
}

func newGroupAdder(by GroupBy, gs []Group) *groupAdder {
	a := &groupAdder{by: by, out: gs, at: make(map[cols]int, len(gs))}
	for i := range gs {
		a.at[gs[i].cols()] = i
	}
	return a
}

func (a *groupAdder) add(c cols, d charge) {
	c = a.by.of(c)
	i, ok := a.at[c]
	if !ok {
		i = len(a.out)
		a.at[c] = i
		a.out = append(a.out, Group{User: c.user, KeyID: c.keyID, Route: c.route, Upstream: c.upstream, Model: c.model, Region: c.region, Plan: c.plan,
			KeyIP: c.ip, KeyAttrs: c.attrs, KeyDesc: c.desc})
	}
	g := &a.out[i]
	g.Entries, g.PendingEntries = addSat(g.Entries, d.entries), addSat(g.PendingEntries, d.entries)
	g.Counts, g.PendingCounts = g.Counts.add(d.counts), g.PendingCounts.add(d.counts)
	g.Charge, g.PendingCharge = addSat(g.Charge, d.cost), addSat(g.PendingCharge, d.cost)
}

// addPending adds tallies, aggregates not yet ticked, to gs as pending
// entries (with a, when not nil, the adder of gs), sorted and bounded as
// CountsBy's answer.
func addPending(gs []Group, by GroupBy, tallies []Entry, a *groupAdder) []Group {
	if a == nil {
		a = newGroupAdder(by, gs)
	}
	for i := range tallies {
		e := &tallies[i]
		a.add(colsOf(e), charge{0, e.Counts(), countedEntry(e.Decision, e.Status, e.HTTPStatus)})
	}
	sortGroups(a.out)
	if len(a.out) > MaxGroups {
		a.out = a.out[:MaxGroups]
	}
	return a.out
}

// localCountsBy answers k, a CountsBy query, from its last read and the
// spool after it, and the aggregates not yet ticked (read first: a tick
// meanwhile has them in both, counted twice rather than not at all).
func (l *Ledger) localCountsBy(k spendQueryKey, storeErr error) ([]Group, error) {
	var tallies []Entry
	if k.by.Desc {
		tallies, _ = l.pendingTallies(k.matchBy())
	}
	last, ok := l.groupReads.last(k, l.answeredAfter(k.from))
	from, partial := l.pendingFrom(last.pos, ok)
	a := newGroupAdder(k.by, slices.Clone(last.groups))
	if err := l.pendingEach(from, k.matchBy(), a.add); err != nil {
		return nil, fmt.Errorf("%w (and the spool: %v)", storeErr, err)
	}
	out := addPending(nil, k.by, tallies, a)
	return out, &LocalSpendError{ReadAt: last.at, Partial: partial, Unknown: !ok && l.answeredAfter(k.from), Err: storeErr}
}

// sortGroups orders gs most requests first, then most tokens, then by
// their columns.
func sortGroups(gs []Group) {
	slices.SortFunc(gs, func(a, b Group) int {
		return cmp.Or(cmp.Compare(b.Counts.Requests, a.Counts.Requests), cmp.Compare(b.Counts.Tokens(), a.Counts.Tokens()),
			cmp.Compare(a.User, b.User), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Route, b.Route),
			cmp.Compare(a.Upstream, b.Upstream), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Region, b.Region), cmp.Compare(a.Plan, b.Plan),
			cmp.Compare(a.KeyIP, b.KeyIP), cmp.Compare(a.KeyAttrs, b.KeyAttrs), cmp.Compare(a.KeyDesc, b.KeyDesc))
	})
}
