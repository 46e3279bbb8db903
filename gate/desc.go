package gate

// A front door's own limits (the rate limit service's descriptor limits,
// Request.Extra) are keyed by what the front door names, which the gate's
// configuration does not list. So that a store that lost their counters
// does not give each a whole window again, a request's ledger entry
// records what it counted on each (ledger.Entry.KeyDesc: the limit, its
// key and the amount, one line a counter), and the restore of a tag after
// a loss reads the entries of the tag's tenant grouped by them
// (ledger.GroupBy.Desc) and brings each counter the entries name back to
// what they counted in its limit's window.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/telemetry"
	"github.com/costgate/costgate/weighted"
)

// maxDescWindow bounds how far back a restore looks for the entries that
// name descriptor counters: a window of a descriptor limit longer than it
// (a year's override) is restored from its last maxDescWindow only.
const maxDescWindow = 32 * 24 * time.Hour

// descAmount is what the request counts on its extra limit e that a
// restore of the caller's tenant brings back (descAmountIn of the
// caller's tenant); 0 for a limit whose key is under another tag than
// the tenant's (a descriptor that names no tenant), which TallyShared
// records instead.
func (r *Reservation) descAmount(e *Extra) int64 {
	if r.req.Caller == nil || r.req.Caller.Tenant == "" {
		return 0
	}
	return r.descAmountIn(e, r.req.Caller.Tenant)
}

// descAmountIn is extraAmount of e when e's key is under tag, 0 when it
// is under another.
func (r *Reservation) descAmountIn(e *Extra, tag string) int64 {
	if weighted.HashTag(e.Key) != tag {
		return 0
	}
	return r.extraAmount(e)
}

// extraAmount is what the request counts on its extra limit e: the
// charge of a Served request, the cost of any other; 0 for a limit set to
// Forget.
func (r *Reservation) extraAmount(e *Extra) int64 {
	if e.Forget {
		return 0
	}
	if r.req.Served {
		return e.Charged
	}
	return e.Cost
}

// CountsExtra tells whether the request counts on any of its extra
// limits under its tenant's tag: its ledger entry then records them (see
// descKeys), which a restore after a loss reads, so a front door records
// it even when it costs nothing.
func (r *Reservation) CountsExtra() bool {
	for i := range r.req.Extra {
		if r.descAmount(&r.req.Extra[i]) > 0 {
			return true
		}
	}
	return false
}

// descKeys is the entry's KeyDesc: a line for each extra limit the
// request counts on under its tenant's tag (see appendDescLine), in the
// request's order, "" for none. Lines that would take it past
// ledger.MaxKeyDesc are left out: their counters are not restored (an
// entry the ledger refused would lose the request's spend).
func (r *Reservation) descKeys() string {
	if len(r.req.Extra) == 0 || r.req.Caller == nil || r.req.Caller.Tenant == "" {
		return ""
	}
	return r.descKeysIn(r.req.Caller.Tenant)
}

// descKeysIn is descKeys of the extra limits under tag.
func (r *Reservation) descKeysIn(tag string) string {
	var b []byte
	for i := range r.req.Extra {
		e := &r.req.Extra[i]
		n := r.descAmountIn(e, tag)
		if n <= 0 {
			continue
		}
		start := len(b)
		if start > 0 {
			b = append(b, '\n')
		}
		b = appendDescLine(b, e.Limit, e.Key, n)
		if len(b) > ledger.MaxKeyDesc {
			b = b[:start]
		}
	}
	return string(b)
}

// sharedTags returns the hash tags, other than its tenant's, of the
// extra limits the request counts on (a rate limit service's descriptor
// that names no tenant is under its domain's tag, {rls:DOMAIN}), each
// once, in the request's order; nil for none.
func (r *Reservation) sharedTags() []string {
	var tags []string
	for i := range r.req.Extra {
		e := &r.req.Extra[i]
		tag := weighted.HashTag(e.Key)
		if (r.req.Caller != nil && tag == r.req.Caller.Tenant) || tag == globalTag || r.extraAmount(e) <= 0 {
			continue
		}
		if !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	return tags
}

// TallyShared records what the request counts on its extra limits under
// a tag other than its tenant's (see sharedTags): for each such tag, a
// tally (ledger.Tally) of no cost whose tenant is the tag itself and
// whose KeyDesc names those counters. The restore of such a tag after a
// loss restores the tenant of its name (see freshStore.restored), whose
// descriptor counters it reads from that tenant's entries
// (descCounters): so these come back as a tenant's do, where they came
// back empty, a whole window more of each. A front door calls it for
// every admitted request that counts on such a limit, before its
// tenant's Record (a refusal after it counts early, never late); Tally
// records them itself, in the same append. A tag the ledger cannot hold
// as a tenant (longer than a key field) is not recorded: its counters
// come back empty. It refuses as Record does when the ledger cannot take
// a tally.
func (r *Reservation) TallyShared(ctx context.Context) (Decision, bool) {
	es := r.sharedEntries(nil)
	if len(es) == 0 {
		return Decision{}, true
	}
	t := r.g.begin(ctx, telemetry.StageLedger)
	err := r.g.ledger.Tally(ctx, es...)
	t.end()
	if err != nil {
		return r.ledgerRefused(ctx, err), false
	}
	return Decision{}, true
}

// sharedEntries appends to es the tallies of TallyShared.
func (r *Reservation) sharedEntries(es []ledger.Entry) []ledger.Entry {
	if len(r.req.Extra) == 0 {
		return es
	}
	for _, tag := range r.sharedTags() {
		if !ledger.ValidKeyText(tag) {
			continue
		}
		desc := r.descKeysIn(tag)
		if desc == "" {
			continue
		}
		decision := "allow"
		if r.decision.Outcome != "" {
			decision = string(r.decision.Outcome)
		}
		es = append(es, ledger.Entry{RequestID: r.req.ID, Tenant: tag, Route: r.policyRoute(), Region: r.st.cfg.Region,
			Decision: decision, Status: ledger.StatusSettled, KeyDesc: desc, CreatedAt: r.start})
	}
	return es
}

// appendDescLine appends the line of KeyDesc for amount n counted on l's
// counter key: the limit's name, algorithm, rate, period in nanoseconds,
// burst and calendar, the key and n, separated by tabs, the name and the
// key written by appendDescText.
func appendDescLine(b []byte, l weighted.Limit, key string, n int64) []byte {
	b = appendDescText(b, l.Name)
	for _, v := range [...]int64{int64(l.Algorithm), l.Rate, int64(l.Period), l.Burst, int64(l.Calendar)} {
		b = strconv.AppendInt(append(b, '\t'), v, 10)
	}
	b = appendDescText(append(b, '\t'), key)
	return strconv.AppendInt(append(b, '\t'), n, 10)
}

// appendDescText appends s as valid UTF-8 text with no tab, newline or
// NUL: '%', control bytes and bytes that are not UTF-8 are written %XX,
// so that the text reads back as s byte for byte.
func appendDescText(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '%' && c != 0x7f && c < utf8.RuneSelf {
			b = append(b, c)
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			if r, n := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || n > 1 {
				b = append(b, s[i:i+n]...)
				i += n
				continue
			}
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
		i++
	}
	return b
}

// descText reads what appendDescText wrote.
func descText(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), true
}

// descCounter is one line of a KeyDesc.
type descCounter struct {
	limit weighted.Limit
	key   string
	n     int64
}

// parseDesc reads the lines of a KeyDesc; a line it cannot read is left
// out (written by no version of the gate).
func parseDesc(s string) []descCounter {
	var out []descCounter
	for line := range strings.SplitSeq(s, "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 8 {
			continue
		}
		var v [6]int64
		ok := true
		for i, t := range [...]string{f[1], f[2], f[3], f[4], f[5], f[7]} {
			n, err := strconv.ParseInt(t, 10, 64)
			ok = ok && err == nil
			v[i] = n
		}
		name, okName := descText(f[0])
		key, okKey := descText(f[6])
		if !ok || !okName || !okKey || v[5] <= 0 || v[0] < 0 || v[0] > 255 || v[4] < 0 || v[4] > 255 {
			continue
		}
		l := weighted.Limit{Name: name, Algorithm: weighted.Algorithm(v[0]), Rate: v[1], Period: time.Duration(v[2]),
			Burst: v[3], Calendar: weighted.Calendar(v[4])}
		out = append(out, descCounter{l, key, v[5]})
	}
	return out
}

// noteFailClosedExtra notes that the extra limit name is fail-closed.
func (g *Gate) noteFailClosedExtra(name string) {
	if _, ok := g.failClosedExtras.Load(name); !ok {
		g.failClosedExtras.Store(name, true)
	}
}

// descCounters returns an item for every counter of a front door's limit
// under tag tenant that the tenant's ledger entries counted on in its
// limit's window (see descKeys), and what they counted, as a fallback of
// share replicas counts it, skipping those seen (and marking the rest).
// An item of extra (the request's) with the same limit and key takes its
// limit from it. It reads the tenant's entries that record such
// counters over maxDescWindow, then over each distinct window of the
// limits they name. While the ledger's database is out, from what this
// node knows (see ledger.LocalSpendError); when extra names a limit
// that this replica's requests named fail-closed, a read this node never
// made fails the restore, as a fail-closed limit's does. A restore found
// by a request that names none (a proxied request) restores the
// tenant's fail-closed descriptor counters from what this node knows.
func (g *Gate) descCounters(ctx context.Context, st *state, tenant string, extra []weighted.Item,
	seen map[string]bool, share int64) ([]weighted.Item, []int64, error) {
	if len(extra) == 0 && len(st.cfg.RLS.Domains) == 0 {
		// No rate limit service: no descriptor limit to restore, and no
		// read of the tenant's last 32 days at each restore.
		return nil, nil, nil
	}
	region := ""
	if g.regions != nil {
		region = st.cfg.Region
	}
	failClosed := false
	for _, it := range extra {
		if _, ok := g.failClosedExtras.Load(it.Limit.Name); ok {
			failClosed = true
		}
	}
	reads := map[time.Time][]ledger.Group{}
	read := func(from time.Time) ([]ledger.Group, error) {
		if gs, ok := reads[from]; ok {
			return gs, nil
		}
		q := ledger.SpendQuery{Tenant: tenant, Region: region, From: from, To: from.AddDate(100, 0, 0)}
		gs, err := g.ledger.CountsBy(ctx, q, ledger.GroupBy{Desc: true})
		if err := knownSpend(err, failClosed); err != nil {
			return nil, fmt.Errorf("gate: descriptor counts of %s: %w", tenant, err)
		}
		reads[from] = gs
		return gs, nil
	}
	now := time.Now()
	wide := now.Add(-maxDescWindow).Truncate(time.Minute)
	all, err := read(wide)
	if err != nil || len(all) == 0 {
		return nil, nil, err
	}
	// The windows the counters' limits need, each read once.
	froms := map[string]time.Time{} // by "name\x00key"
	for i := range all {
		for _, c := range parseDesc(all[i].KeyDesc) {
			from := (&compiledLimit{limit: c.limit}).spentSince(now)
			if from.Before(wide) {
				from = wide
			}
			froms[c.limit.Name+"\x00"+c.key] = from
		}
	}
	mine := map[string]weighted.Limit{}
	for _, it := range extra {
		mine[it.Limit.Name+"\x00"+it.Key] = it.Limit
	}
	var (
		items   []weighted.Item
		counted []int64
		pending []int64
		at      = map[string]int{}
	)
	for id, from := range froms {
		if seen[id] {
			continue
		}
		gs, err := read(from)
		if err != nil {
			return nil, nil, err
		}
		for i := range gs {
			for _, c := range parseDesc(gs[i].KeyDesc) {
				if c.limit.Name+"\x00"+c.key != id || weighted.HashTag(c.key) != tenant {
					continue
				}
				j, ok := at[id]
				if !ok {
					l, known := mine[id]
					if !known {
						l = c.limit
					}
					j = len(items)
					at[id] = j
					items, counted, pending = append(items, weighted.Item{Limit: l, Key: c.key}), append(counted, 0), append(pending, 0)
				}
				counted[j] = costmodel.AddSat(counted[j], costmodel.MulSat(c.n, gs[i].Entries))
				pending[j] = costmodel.AddSat(pending[j], costmodel.MulSat(c.n, gs[i].PendingEntries))
			}
		}
	}
	for id := range at {
		seen[id] = true
	}
	for j := range counted {
		counted[j] = max(shareOf(costmodel.NanoUSD(counted[j]), costmodel.NanoUSD(pending[j]), share), 0)
	}
	return items, counted, nil
}
