package telemetry

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Label values that come from configuration (policies, limits, routes,
// dimensions) or from requests (tenants, models) are interned into small
// integer ids by a labelSet, so that the attribute sets for each combination
// of ids can be built once and cached. A labelSet holds at most max distinct
// values; later values fold into [Other]. Values are assigned ids in the order
// first seen, for the life of the Telemetry.
//
// Reads are lock-free: the value-to-id map is copy-on-write behind an atomic
// pointer, and only the first sighting of a value takes the mutex. Because the
// number of values is bounded, so is the total copying.

// Other is the label value that stands for every value past a label's
// cardinality bound (for example the 101st distinct tenant with the default
// MaxTenants of 100).
const Other = "other"

// None is the label value recorded for an empty string (for example a request
// that no policy decided).
const None = "none"

type labelSet struct {
	max   int
	mu    sync.Mutex
	ids   atomic.Pointer[map[string]int]
	names atomic.Pointer[[]string] // id -> value; names[max] is Other
}

func newLabelSet(max int) *labelSet {
	l := &labelSet{max: max}
	m := map[string]int{}
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
	return l.slow(v)
}

func (l *labelSet) slow(v string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.ids.Load()
	if id, ok := old[v]; ok {
		return id
	}
	if len(old) >= l.max || v == Other {
		return l.max
	}
	v = strings.Clone(v) // do not pin the caller's (possibly large) buffer
	id := len(old)
	m := make(map[string]int, len(old)+1)
	for k, i := range old {
		m[k] = i
	}
	m[v] = id
	names := append([]string(nil), *l.names.Load()...)
	names[id] = v
	l.names.Store(&names)
	l.ids.Store(&m)
	return id
}

// name returns the label value of id.
func (l *labelSet) name(id int) string { return (*l.names.Load())[id] }

// len returns the number of distinct values interned so far, not counting
// Other.
func (l *labelSet) len() int { return len(*l.ids.Load()) }

// attrs is a pre-built attribute set in the two option shapes the metric API
// takes, so that recording allocates nothing.
type attrs struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newAttrs(kv ...attribute.KeyValue) attrs {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return attrs{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// attrCache maps a key of label ids to its attribute set, built on first use
// by build. Like labelSet it is copy-on-write: lookups are lock-free and the
// key space is bounded by the labelSets the ids come from.
type attrCache[K comparable] struct {
	mu    sync.Mutex
	m     atomic.Pointer[map[K]attrs]
	build func(K) attrs
}

func newAttrCache[K comparable](build func(K) attrs) *attrCache[K] {
	c := &attrCache[K]{build: build}
	m := map[K]attrs{}
	c.m.Store(&m)
	return c
}

func (c *attrCache[K]) get(k K) attrs {
	if a, ok := (*c.m.Load())[k]; ok {
		return a
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	if a, ok := old[k]; ok {
		return a
	}
	a := c.build(k)
	m := make(map[K]attrs, len(old)+1)
	for k2, v := range old {
		m[k2] = v
	}
	m[k] = a
	c.m.Store(&m)
	return a
}

// Outcomes, by id.
const (
	outcomeAllow = iota
	outcomeSoft
	outcomeHard
	outcomeOther
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"allow", "soft", "hard", Other}

func outcomeID(s string) int {
	switch s {
	case "allow":
		return outcomeAllow
	case "soft":
		return outcomeSoft
	case "hard":
		return outcomeHard
	}
	return outcomeOther
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
