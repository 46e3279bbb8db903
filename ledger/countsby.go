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
	"strconv"
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
// entries that record some. Its answer is one per counter, not one per
// KeyDesc text: tallies (Ledger.Tally) make nearly every ten seconds of
// a tenant's calls a text of its own, past MaxGroups of them in days, and
// a limiter needs the sum of each counter. A group's KeyDesc is one
// line, the counter (a line's text before its last tab, see parseTally)
// and what the selected entries counted on it (the sum of each entry's
// amount on that counter), with Entries 1; the part of that sum that is
// pending (this node's tallies not yet in the store's entries, and in an
// answer from this node's records the records spooled after the last
// read) is in a second group of the same counter, with Entries and
// PendingEntries 1. So, as for any KeyDesc, a group's Entries times its
// line's amount is what it counted on the counter, and PendingEntries
// times it the pending part. The other columns by names group the
// counters too. A counter the entries counted nothing on (their entries
// count none, see Group.Entries) is left out, and so is a line that does
// not end with a tab and a positive amount. Counts, Charge and their
// pending parts are zero in such groups: an entry counts on each of its
// counters, and its counts in each would be counted once per counter.
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
	// empty for the others. KeyDesc, grouped by Desc, is one descriptor
	// counter's line and the group's sum on it (see GroupBy.Desc).
	User, KeyID, Route, Upstream, Model, Region, Plan, KeyIP, KeyAttrs, KeyDesc string
	// Entries is how many of the group's entries count on a limiter: of
	// an admitted decision, and not failed without an HTTP status (see
	// Entry.Counts), saturating.
	Entries int64
	// PendingEntries is, in an answer from this node's records, the part
	// of Entries from the records spooled after the last read (see
	// PendingCounts); in the store's answer, the aggregates of this node's
	// tallies not yet in the store (see Ledger.Tally) that a grouped read by
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

// MaxGroups bounds the groups of one CountsBy answer; grouped by Desc,
// its counters (each one group, or two with a pending part).
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
// entries, those with entries that count nothing too (grouped by Desc,
// per counter instead, see GroupBy.Desc). It reads the
// tenant's entries in the range once (an index range scan, as Counts
// does), so its cost grows with them: it is for a rare read, the
// counters of a tenant's limits keyed by route, upstream, model or region
// restored after the limiter's store lost its data. The groups come
// most requests first; past MaxGroups, the groups of the fewest
// requests are left out. Grouped by Desc, the answer is one group (or
// two, see GroupBy.Desc) per descriptor counter, summed over every
// distinct KeyDesc in the range, the counters of the largest sums first;
// past MaxGroups counters, those of the smallest sums are left out.
//
// When the store fails (and ctx is not done), a ledger with a spool
// answers as Counts does: the last groups read for the same query plus
// this node's records spooled since (each group's part of them in its
// PendingCounts and PendingCharge; grouped by Desc, in each counter's
// pending group), with a *LocalSpendError whose
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
	// The aggregates not yet ticked, and those ticked whose entries the
	// flusher has not applied yet, are not in the store: added to its
	// answer as this node's pending entries. Read before the store, they
	// are in both only if the flusher applied the entry of one of them
	// meanwhile (anyApplied): read again. (One whose commit the read saw
	// but whose applied position the flusher had not noted yet when
	// anyApplied looked, a window of a few instructions, is counted
	// twice.)
	for try := 0; ; try++ {
		var aggs []*tallyAgg
		if k.by.Desc && l.spool != nil {
			tallies, aggs, _ = l.pendingTallies(k.matchBy(), true)
		}
		gs, err = readGroups(ctx, l.store, k, from, to)
		if err != nil || len(tallies) == 0 || !l.anyApplied(aggs) || try == 2 {
			break // after three tries, counted twice rather than not at all
		}
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

// readGroups is s's answer to k over [from, to) as CountsBy answers it:
// sorted and bounded by MaxGroups; grouped by Desc, every group the store
// has, each summed on its counters as the store streams it (see
// descFold), so that no distinct KeyDesc is left out.
func readGroups(ctx context.Context, s store, k spendQueryKey, from, to time.Time) ([]Group, error) {
	if k.by.Desc {
		f := newDescFold()
		if err := s.countsBy(ctx, k, from, to, 0, f.add); err != nil {
			return nil, err
		}
		return f.groups(MaxGroups), nil
	}
	var gs []Group
	if err := s.countsBy(ctx, k, from, to, MaxGroups, func(g *Group) { gs = append(gs, *g) }); err != nil {
		return nil, err
	}
	sortGroups(gs)
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

// addPending adds tallies, aggregates not yet in the store, to gs as pending
// entries (with a, when not nil, the adder of gs), and returns them as
// CountsBy answers (see answerOf).
func addPending(gs []Group, by GroupBy, tallies []Entry, a *groupAdder) []Group {
	if a == nil {
		a = newGroupAdder(by, gs)
	}
	for i := range tallies {
		e := &tallies[i]
		a.add(colsOf(e), charge{0, e.Counts(), countedEntry(e.Decision, e.Status, e.HTTPStatus)})
	}
	return answerOf(by, a.out)
}

// answerOf is gs as CountsBy answers them: sorted and bounded by
// MaxGroups; grouped by Desc, summed on their counters (see descFold),
// which groups already summed so pass through unchanged.
func answerOf(by GroupBy, gs []Group) []Group {
	if by.Desc {
		f := newDescFold()
		for i := range gs {
			f.add(&gs[i])
		}
		return f.groups(MaxGroups)
	}
	sortGroups(gs)
	if len(gs) > MaxGroups {
		gs = gs[:MaxGroups]
	}
	return gs
}

// descFold sums groups by their descriptor counters (see GroupBy.Desc):
// for each of a group's KeyDesc lines, its amount times the group's
// Entries, and times its PendingEntries, saturating, under the group's
// other columns and the line's counter. It keeps one sum per distinct
// counter, however many distinct KeyDesc texts hold them. Its answer is
// a fixed point: groups it answered, summed again, give the same groups.
type descFold struct {
	sums map[cols]*descSums
}

// descSums is what a descFold summed on one counter: all of it, and its
// pending part.
type descSums struct {
	all, pending int64
}

func newDescFold() *descFold {
	return &descFold{sums: make(map[cols]*descSums)}
}

func (f *descFold) add(g *Group) {
	c := g.cols()
	for line := range strings.SplitSeq(g.KeyDesc, "\n") {
		d, ok := descLineOf(line)
		if !ok {
			continue // written by no version of the gate, which skips it too
		}
		c.desc = d.prefix
		s, ok := f.sums[c]
		if !ok {
			c.desc = strings.Clone(d.prefix) // not to keep the whole text
			s = &descSums{}
			f.sums[c] = s
		}
		s.all = addSat(s.all, costmodel.MulSat(d.n, g.Entries))
		s.pending = addSat(s.pending, costmodel.MulSat(d.n, g.PendingEntries))
	}
}

// groups returns the sums as groups (see GroupBy.Desc), at most limit
// counters, those of the largest sums.
func (f *descFold) groups(limit int) []Group {
	type counter struct {
		c cols
		descSums
	}
	cs := make([]counter, 0, len(f.sums))
	for c, s := range f.sums {
		if s.all > 0 {
			cs = append(cs, counter{c, *s})
		}
	}
	slices.SortFunc(cs, func(a, b counter) int { return cmp.Or(cmp.Compare(b.all, a.all), compareCols(a.c, b.c)) })
	if len(cs) > limit {
		cs = cs[:limit]
	}
	out := make([]Group, 0, len(cs))
	line := func(c cols, n, pending int64) {
		out = append(out, Group{User: c.user, KeyID: c.keyID, Route: c.route, Upstream: c.upstream, Model: c.model, Region: c.region, Plan: c.plan,
			KeyIP: c.ip, KeyAttrs: c.attrs, KeyDesc: c.desc + "\t" + strconv.FormatInt(n, 10), Entries: 1, PendingEntries: pending})
	}
	for _, x := range cs {
		// The pending part is part of all of it; only groups whose
		// PendingEntries exceed their Entries, which no answer has, could
		// make it more.
		pending := min(x.pending, x.all)
		if rest := x.all - pending; rest > 0 {
			line(x.c, rest, 0)
		}
		if pending > 0 {
			line(x.c, pending, 1)
		}
	}
	return out
}

// localCountsBy answers k, a CountsBy query, from its last read and the
// spool after it up to where it ended when the aggregates not yet ticked
// were read, and those aggregates: a tick after that read appends their
// entries past that end, and one before it had appended them before it
// (pendingTallies waits for a tick's append under way). Before
// 2026-12-07 the spool was read to its end, so that a tick between the
// two reads had its aggregates counted twice, and one amid its append
// had them in neither.
func (l *Ledger) localCountsBy(k spendQueryKey, storeErr error) ([]Group, error) {
	var tallies []Entry
	to := int64(maxPosition)
	if k.by.Desc {
		tallies, _, to = l.pendingTallies(k.matchBy(), false)
	}
	last, ok := l.groupReads.last(k, l.answeredAfter(k.from))
	from, partial := l.pendingFrom(last.pos, ok)
	a := newGroupAdder(k.by, slices.Clone(last.groups))
	if err := l.pendingEach(from, to, k.matchBy(), a.add); err != nil {
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
			compareCols(a.cols(), b.cols()))
	})
}

// compareCols orders columns by user, key, route, upstream, model,
// region, plan, address, attributes and descriptor counters.
func compareCols(a, b cols) int {
	return cmp.Or(cmp.Compare(a.user, b.user), cmp.Compare(a.keyID, b.keyID), cmp.Compare(a.route, b.route),
		cmp.Compare(a.upstream, b.upstream), cmp.Compare(a.model, b.model), cmp.Compare(a.region, b.region), cmp.Compare(a.plan, b.plan),
		cmp.Compare(a.ip, b.ip), cmp.Compare(a.attrs, b.attrs), cmp.Compare(a.desc, b.desc))
}
