package telemetry

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Label values that come from configuration (policies, limits, routes,
// dimensions) or from requests (tenants, models) are interned into small
// integer ids by a labelSet, so that the attribute sets for each combination
// of ids can be built once and cached. A labelSet holds at most max distinct
// values; later values fold into [Other]. Values are assigned ids in the order
// first seen, for the life of the Telemetry.
//
// A value is cleaned before it becomes a label: cut at MaxLabelLen bytes and
// made valid UTF-8 (a Prometheus scrape fails as a whole on one invalid
// label value). The raw value is remembered as an alias of its id, as are
// values folded into Other, so that later sightings take the fast path; the
// aliases are bounded too (aliasBudget). Past that bound a clean value not
// in the map is Other without a lock (saturated); only a value that needs
// cleaning still takes the mutex each time, to find its cleaned value's id.
//
// Reads are lock-free: the value-to-id map is copy-on-write behind an atomic
// pointer, and only a first sighting takes the mutex. Because the number of
// entries is bounded, so is the total copying.

// Other is the label value that stands for every value past a label's
// cardinality bound (for example the 101st distinct tenant with the default
// MaxTenants of 100).
const Other = "other"

// None is the label value recorded for an empty string (for example a request
// that no policy decided).
const None = "none"

// MaxLabelLen is the length in bytes at which label values are cut.
const MaxLabelLen = 128

// aliasBudget bounds the entries of a labelSet's map beyond its values.
const aliasBudget = 4096

type labelSet struct {
	max   int
	mu    sync.Mutex
	n     int // distinct values interned, guarded by mu
	ids   atomic.Pointer[map[string]int]
	names atomic.Pointer[[]string] // id -> value; names[max] is Other
	// saturated is set once every id is taken and the alias budget spent:
	// a clean value the map does not hold is then Other.
	saturated atomic.Bool
}

func newLabelSet(max int) *labelSet {
	l := &labelSet{max: max}
	m := map[string]int{Other: max}
	names := make([]string, max+1)
	names[max] = Other
	l.ids.Store(&m)
	l.names.Store(&names)
	return l
}

// id returns v's id in [0, max]; max is the id of Other.
func (l *labelSet) id(v string) int {
	if v == "" {
		v = None
	}
	if id, ok := (*l.ids.Load())[v]; ok {
		return id
	}
	if l.saturated.Load() && len(v) <= MaxLabelLen && utf8.ValidString(v) {
		return l.max // what slow would answer, without its lock
	}
	return l.slow(v)
}

func cleanLabel(v string) string {
	if len(v) > MaxLabelLen {
		v = v[:MaxLabelLen] // a cut rune becomes invalid UTF-8, replaced below
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

func (l *labelSet) slow(v string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.ids.Load()
	if id, ok := old[v]; ok {
		return id
	}
	clean := cleanLabel(v)
	id, known := old[clean]
	if !known && l.n < l.max {
		id, known = l.n, true
		l.n++
		clean = strings.Clone(clean) // do not pin the caller's (possibly large) buffer
		names := append([]string(nil), *l.names.Load()...)
		names[id] = clean
		l.names.Store(&names) // before the map, so that a reader of the id finds its name
		if clean == v || len(v) > MaxLabelLen*4 {
			l.add(old, id, clean) // a long raw value is not kept: it takes the slow path each time
		} else {
			l.add(old, id, clean, strings.Clone(v))
		}
		return id
	}
	if !known {
		id = l.max
	}
	// An alias: a raw value for a cleaned one, or a value folded into Other.
	switch {
	case len(old) < l.max+aliasBudget && len(v) <= MaxLabelLen*4:
		l.add(old, id, strings.Clone(v))
	case len(old) >= l.max+aliasBudget && l.n >= l.max:
		l.saturated.Store(true)
	}
	return id
}

// add publishes a copy of old with each of keys -> id. Called with mu held.
func (l *labelSet) add(old map[string]int, id int, keys ...string) {
	m := make(map[string]int, len(old)+len(keys))
	for k, i := range old {
		m[k] = i
	}
	for _, k := range keys {
		m[k] = id
	}
	l.ids.Store(&m)
}

// name returns the label value of id.
func (l *labelSet) name(id int) string { return (*l.names.Load())[id] }

// cache maps a key of label ids to a value (the cells of that label
// combination), built on first use by build, exactly once. Like labelSet it
// is copy-on-write: lookups are lock-free, and the key space is bounded by
// the labelSets the ids come from.
type cache[K comparable, V any] struct {
	mu    sync.Mutex
	m     atomic.Pointer[map[K]V]
	build func(K) V
}

func newCache[K comparable, V any](build func(K) V) *cache[K, V] {
	c := &cache[K, V]{build: build}
	m := map[K]V{}
	c.m.Store(&m)
	return c
}

func (c *cache[K, V]) get(k K) V {
	if v, ok := (*c.m.Load())[k]; ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	if v, ok := old[k]; ok {
		return v
	}
	v := c.build(k)
	m := make(map[K]V, len(old)+1)
	for k2, v2 := range old {
		m[k2] = v2
	}
	m[k] = v
	c.m.Store(&m)
	return v
}

// Outcome is what a decision did to a request, the outcome label of
// costgate.requests. The set is closed: any other value is recorded as
// "other".
type Outcome string

// Outcomes of a decision.
const (
	// OutcomeNone means no decision was taken (the request was refused
	// before its limits were debited, or for a fault of its own); the
	// proxy records nothing for it.
	OutcomeNone  Outcome = ""
	OutcomeAllow Outcome = "allow" // served as asked
	OutcomeSoft  Outcome = "soft"  // served with friction
	OutcomeHard  Outcome = "hard"  // refused
)

// Outcomes, by id.
const (
	outcomeAllow = iota
	outcomeSoft
	outcomeHard
	outcomeOther
	numOutcomes
	// seriesShadow is an outcome of the series only: would-blocks of a
	// shadow policy or limit.
	seriesShadow      = numOutcomes
	numSeriesOutcomes = numOutcomes + 1
)

var outcomeNames = [numSeriesOutcomes]string{string(OutcomeAllow), string(OutcomeSoft), string(OutcomeHard), Other, "shadow"}

func outcomeID(o Outcome) int {
	switch o {
	case OutcomeAllow:
		return outcomeAllow
	case OutcomeSoft:
		return outcomeSoft
	case OutcomeHard:
		return outcomeHard
	}
	return outcomeOther
}

// seriesOutcomeID orders the series' outcomes, shadow last.
func seriesOutcomeID(s string) int {
	if s == "shadow" {
		return seriesShadow
	}
	return outcomeID(Outcome(s))
}

// statusID folds an HTTP status into [0, 600): 0 stands for anything outside
// 100-599.
func statusID(code int) int {
	if code < 100 || code > 599 {
		return 0
	}
	return code
}

func statusName(id int) string {
	if id == 0 {
		return Other
	}
	return strconv.Itoa(id)
}
