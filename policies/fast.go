package policies

// The fast path.
//
// The general Rego evaluator (topdown) spends most of a decision converting
// the input to ast values, allocating bindings and caches, and converting the
// result back: about 900 allocations for the example policies. Policies of
// the shape costgate needs (comparisons, integer arithmetic, iteration over
// input.limits and input.spend, lookups in constant tables, helper rules,
// else chains) are compiled here, at load time, from the OPA compiler's own
// output (the rewritten, type-checked, safety-ordered rule bodies) into a
// small backtracking program that reads the Go Input directly and allocates
// only when it builds a decision object.
//
// The program is not a second Rego dialect: it evaluates exactly the
// compiled bodies, and it bails out (errBail) to the general evaluator on
// anything it does not reproduce exactly: an integer overflow (Rego numbers
// are arbitrary-precision), a division that is not exact, a comparison
// across types, a conflict between complete rule values, an ill-typed
// builtin call, an ill-formed decision. Constructs it does not know (with,
// every, comprehensions, functions, most builtins) make the whole policy use
// the general evaluator, decided once at load time. TestFastPathEqualsRego
// compares both on randomized inputs.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// fastPanics counts recovered panics of the fast path.
var fastPanics atomic.Int64

// errBail means: this input needs the general evaluator.
var errBail = errors.New("policies: fast path cannot decide this input")

// errUnsupported is returned at compile time for constructs the fast path
// does not implement.
type errUnsupported struct{ why string }

func (e *errUnsupported) Error() string { return e.why }

func unsupported(format string, args ...any) error {
	return &errUnsupported{fmt.Sprintf(format, args...)}
}

// kind is the type of a value.
type kind uint8

const (
	kUndef  kind = iota // undefined: the expression fails
	kNull               // null
	kBool               // n is 0 or 1
	kInt                // n
	kStr                // s
	kLimit              // input.limits[n]
	kSpend              // input.spend[n]
	kLimits             // input.limits
	kSpends             // input.spend
	kConst              // x.(*constVal), a composite constant
	kObj                // x.(*dynObj), an object built at evaluation time
	kSet                // x.(*[]value), the members of a partial set rule
)

// value is a Rego value. It is a plain struct so that evaluating a policy
// does not allocate for scalars.
type value struct {
	k kind
	n int64
	s string
	x any
}

var undef = value{}

func intVal(n int64) value        { return value{k: kInt, n: n} }
func strVal(s string) value       { return value{k: kStr, s: s} }
func boolVal(b bool) value        { return value{k: kBool, n: int64(boolInt(b))} }
func (v value) truthy() bool      { return v.k != kUndef && !(v.k == kBool && v.n == 0) }
func (v value) scalar() bool      { return v.k >= kNull && v.k <= kStr }
func (v value) constV() *constVal { return v.x.(*constVal) }

// constVal is a composite constant from the policy source.
type constVal struct {
	json    any              // its JSON form, shared and read-only
	fields  map[string]value // objects with string keys
	keys    []value          // objects: keys; arrays: indexes; sets: members
	elems   []value          // objects: values; arrays: elements; sets: members
	strs    map[string]bool  // sets and arrays of only strings: the members
	isArray bool
	isSet   bool
	verdict *verdict // when the constant is a valid decision
}

// dynObj is an object built at evaluation time; keys are sorted.
type dynObj struct {
	keys []string
	vals []value
}

func (o *dynObj) get(k string) value {
	for i, kk := range o.keys {
		if kk == k {
			return o.vals[i]
		}
	}
	return undef
}

// constOf converts a ground ast value.
func constOf(v ast.Value) (value, error) {
	switch x := v.(type) {
	case ast.Null:
		return value{k: kNull}, nil
	case ast.Boolean:
		return boolVal(bool(x)), nil
	case ast.Number:
		i, ok := x.Int64()
		if !ok || strings.ContainsAny(string(x), ".eE") {
			return undef, unsupported("number %s is not a 64-bit integer", x)
		}
		return intVal(i), nil
	case ast.String:
		return strVal(string(x)), nil
	}
	if !ast.IsConstant(v) {
		return undef, unsupported("%v is not constant", v)
	}
	j, err := ast.JSON(v)
	if err != nil {
		return undef, unsupported("%v: %v", v, err)
	}
	c := &constVal{json: j}
	add := func(k, e value) {
		c.keys = append(c.keys, k)
		c.elems = append(c.elems, e)
	}
	var err2 error
	switch x := v.(type) {
	case ast.Object:
		c.fields = map[string]value{}
		x.Foreach(func(k, t *ast.Term) {
			kv, err := constOf(k.Value)
			ev, err1 := constOf(t.Value)
			if err2 == nil {
				err2 = errors.Join(err, err1)
			}
			add(kv, ev)
			if kv.k == kStr {
				c.fields[kv.s] = ev
			}
		})
	case *ast.Array:
		c.isArray = true
		x.Foreach(func(t *ast.Term) {
			ev, err := constOf(t.Value)
			if err2 == nil {
				err2 = err
			}
			add(intVal(int64(len(c.keys))), ev)
		})
	case ast.Set:
		c.isSet = true
		x.Foreach(func(t *ast.Term) {
			ev, err := constOf(t.Value)
			if err2 == nil {
				err2 = err
			}
			add(ev, ev)
		})
	default:
		return undef, unsupported("constant %v", v)
	}
	if err2 != nil {
		return undef, err2
	}
	if c.isArray || c.isSet {
		c.strs = map[string]bool{}
		for _, e := range c.elems {
			if e.k != kStr {
				c.strs = nil
				break
			}
			c.strs[e.s] = true
		}
	}
	if d, err := decodeVerdict(j); err == nil {
		c.verdict = &d
	}
	return value{k: kConst, x: c}, nil
}

// machine is the state of one decision. Machines are pooled per program.
type machine struct {
	p     *program
	in    *Input
	state []uint8 // per rule: ruleTodo, ruleBusy, ruleDone or ruleBailed
	vals  []value // per rule: its value once done
	sets  [][]value
	stack []value
	top   int
	bail  bool
	why   string // what made the machine bail, for tests and debugging
}

// bailOut hands the current input over to the general evaluator.
func (m *machine) bailOut(why string) {
	m.bail = true
	if m.why == "" {
		m.why = why
	}
}

func (m *machine) frame(n int) []value {
	if m.top+n > len(m.stack) {
		m.stack = append(m.stack, make([]value, m.top+n-len(m.stack))...)
	}
	f := m.stack[m.top : m.top+n : m.top+n]
	m.top += n
	return f
}

// Rule states in a machine.
const (
	ruleTodo   = iota // not evaluated yet
	ruleBusy          // being evaluated
	ruleDone          // evaluated; its value is in vals
	ruleBailed        // its evaluation bailed out on this input
)

// program is the compiled form of every fast rule of a Set.
type program struct {
	rules  []*crule
	byRef  map[string]*crule
	failed map[string]error
	c      *ast.Compiler
	slots  int
	pool   sync.Pool
}

func (p *program) machine(in *Input) *machine {
	m, _ := p.pool.Get().(*machine)
	if m == nil {
		m = &machine{p: p, stack: make([]value, p.slots)}
	}
	n := len(p.rules)
	if len(m.state) < n {
		m.state = make([]uint8, n)
		m.vals = make([]value, n)
		m.sets = make([][]value, n)
	}
	clear(m.state)
	m.in, m.top, m.bail, m.why = in, 0, false, ""
	return m
}

func (p *program) release(m *machine) {
	m.in = nil
	clear(m.vals)
	clear(m.stack)
	p.pool.Put(m)
}

// crule is a compiled rule: every definition of one complete or partial set
// rule.
type crule struct {
	idx      int
	name     string
	multi    bool       // a partial set rule (contains)
	defs     [][]*level // each definition: its else chain
	deflt    *value
	slots    int
	sameHead bool // every definition has one level and the same constant value
}

type level struct {
	slots int
	body  []step
	head  cterm // complete rules: the value; partial sets: the member
	ghead bool  // head is a constant
}

// fastRule is a compiled decision rule.
type fastRule struct {
	p *program
	r *crule
}

// eval evaluates the rule on m's input.
//
// A panic in the fast path is a bug in this file, never in a policy: it is
// counted in fastPanics (the tests require zero) and the input is handed
// to the general evaluator rather than taking the request down.
func (f *fastRule) eval(m *machine) (d verdict, defined bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			fastPanics.Add(1)
			m.bailOut(fmt.Sprint("panic: ", p))
			d, defined, err = verdict{}, false, errBail
		}
	}()
	v := m.rule(f.r)
	if m.bail {
		return verdict{}, false, errBail
	}
	if v.k == kUndef {
		return verdict{}, false, nil
	}
	if v.k == kConst {
		if c := v.constV(); c.verdict != nil {
			return *c.verdict, true, nil
		}
		return verdict{}, false, errBail
	}
	j, ok := m.toJSON(v)
	if !ok {
		return verdict{}, false, errBail
	}
	dv, derr := decodeVerdict(j)
	if derr != nil {
		return verdict{}, false, errBail // let the general evaluator report it
	}
	return dv, true, nil
}

// rule returns the value of r, evaluating it on first use.
func (m *machine) rule(r *crule) value {
	switch m.state[r.idx] {
	case ruleDone:
		return m.vals[r.idx]
	case ruleBusy:
		m.bailOut("recursion") // the compiler forbids it; be safe anyway
		return undef
	case ruleBailed:
		m.bailOut(r.name + " needs the general evaluator")
		return undef
	}
	m.state[r.idx] = ruleBusy
	top := m.top
	fr := m.frame(r.slots)
	var v value
	if r.multi {
		v = m.evalSet(r, fr)
	} else {
		v = m.evalComplete(r, fr)
	}
	m.top = top
	if m.bail {
		// Never cache a value computed on an input the fast path gave up
		// on: the next rule that reads it must give up too.
		m.state[r.idx] = ruleBailed
		return undef
	}
	m.state[r.idx] = ruleDone
	m.vals[r.idx] = v
	return v
}

func (m *machine) evalComplete(r *crule, fr []value) value {
	result := undef
	for _, chain := range r.defs {
		for _, l := range chain {
			ok := m.solve(l.body, fr, false)
			if m.bail {
				return undef
			}
			if !ok {
				continue
			}
			for {
				v := l.head.eval(m, fr)
				if m.bail {
					return undef
				}
				if v.k != kUndef {
					if result.k == kUndef {
						result = v
					} else if eq, ok := m.equal(result, v); !ok || !eq {
						m.bailOut("conflicting rule values " + r.name) // an error the general evaluator reports
						return undef
					}
				}
				if l.ghead {
					break // every further solution has the same value
				}
				if !m.solve(l.body, fr, true) || m.bail {
					break
				}
			}
			break // the else chain stops at the first level with a solution
		}
		if m.bail {
			return undef
		}
		if result.k != kUndef && r.sameHead {
			break
		}
	}
	if result.k == kUndef && r.deflt != nil {
		return *r.deflt
	}
	return result
}

func (m *machine) evalSet(r *crule, fr []value) value {
	members := m.sets[r.idx][:0]
	for _, chain := range r.defs {
		l := chain[0]
		ok := m.solve(l.body, fr, false)
		for ok && !m.bail {
			v := l.head.eval(m, fr)
			if v.k != kUndef {
				members = append(members, v)
			}
			ok = m.solve(l.body, fr, true)
		}
		if m.bail {
			return undef
		}
	}
	m.sets[r.idx] = members
	return value{k: kSet, x: &m.sets[r.idx]}
}

// step is one compiled expression of a body. first finds its first solution
// given the bindings of the steps before it, next its following one.
type step interface {
	first(m *machine, fr []value) bool
	next(m *machine, fr []value) bool
}

// solve finds the first (resume false) or next (resume true) solution of a
// body, backtracking over the steps that have several solutions.
func (m *machine) solve(body []step, fr []value, resume bool) bool {
	i := 0
	var ok bool
	if resume {
		if len(body) == 0 {
			return false
		}
		i = len(body) - 1
		ok = body[i].next(m, fr)
	} else {
		if len(body) == 0 {
			return true
		}
		ok = body[0].first(m, fr)
	}
	for {
		if m.bail {
			return false
		}
		if ok {
			i++
			if i == len(body) {
				return true
			}
			ok = body[i].first(m, fr)
			continue
		}
		i--
		if i < 0 {
			return false
		}
		ok = body[i].next(m, fr)
	}
}

// det is a step with at most one solution.
type det struct {
	test func(m *machine, fr []value) bool
}

func (d det) first(m *machine, fr []value) bool { return d.test(m, fr) }
func (det) next(*machine, []value) bool         { return false }

// cterm evaluates a term whose variables are all bound.
type cterm interface {
	eval(m *machine, fr []value) value
}

type constTerm struct{ v value }

func (c constTerm) eval(*machine, []value) value { return c.v }

type slotTerm int

func (s slotTerm) eval(_ *machine, fr []value) value { return fr[s] }

type inputTerm func(in *Input) value

func (f inputTerm) eval(m *machine, _ []value) value { return f(m.in) }

type ruleTerm struct{ r *crule }

func (t ruleTerm) eval(m *machine, _ []value) value { return m.rule(t.r) }

// pathTerm is base.k1.k2...
type pathTerm struct {
	base cterm
	path []cterm
}

func (t pathTerm) eval(m *machine, fr []value) value {
	v := t.base.eval(m, fr)
	for _, k := range t.path {
		if v.k == kUndef {
			return undef
		}
		v = m.get(v, k.eval(m, fr))
	}
	return v
}

type objTerm struct {
	keys []string
	vals []cterm
}

func (t objTerm) eval(m *machine, fr []value) value {
	o := &dynObj{keys: t.keys, vals: make([]value, len(t.vals))}
	for i, c := range t.vals {
		v := c.eval(m, fr)
		if v.k == kUndef {
			return undef
		}
		o.vals[i] = v
	}
	return value{k: kObj, x: o}
}

// get returns coll[key], undefined when there is no such element.
func (m *machine) get(coll, key value) value {
	if key.k == kUndef {
		return undef
	}
	switch coll.k {
	case kLimit:
		if key.k != kStr {
			return undef
		}
		return limitField(&m.in.Limits[coll.n], key.s)
	case kSpend:
		if key.k != kStr {
			return undef
		}
		return spendField(&m.in.Spend[coll.n], key.s)
	case kLimits:
		if key.k == kInt && key.n >= 0 && key.n < int64(len(m.in.Limits)) {
			return value{k: kLimit, n: key.n}
		}
	case kSpends:
		if key.k == kInt && key.n >= 0 && key.n < int64(len(m.in.Spend)) {
			return value{k: kSpend, n: key.n}
		}
	case kConst:
		c := coll.constV()
		switch {
		case c.fields != nil && key.k == kStr:
			if v, ok := c.fields[key.s]; ok {
				return v
			}
			return undef
		case c.isArray:
			if key.k == kInt && key.n >= 0 && key.n < int64(len(c.elems)) {
				return c.elems[key.n]
			}
			return undef
		}
		for i, k := range c.keys {
			if eq, ok := m.equal(k, key); !ok {
				return undef
			} else if eq {
				return c.elems[i]
			}
		}
	case kObj:
		if key.k == kStr {
			return coll.x.(*dynObj).get(key.s)
		}
	case kSet:
		for _, e := range *coll.x.(*[]value) {
			if eq, ok := m.equal(e, key); !ok {
				return undef
			} else if eq {
				return e
			}
		}
	}
	return undef
}

// size is the number of elements of a collection, -1 for other values.
func (m *machine) size(coll value) int {
	switch coll.k {
	case kLimits:
		return len(m.in.Limits)
	case kSpends:
		return len(m.in.Spend)
	case kConst:
		return len(coll.constV().elems)
	case kObj:
		return len(coll.x.(*dynObj).keys)
	case kSet:
		return len(*coll.x.(*[]value))
	}
	return -1
}

// elem returns the key and value of the i-th element of a collection.
func (m *machine) elem(coll value, i int) (key, val value) {
	switch coll.k {
	case kLimits:
		return intVal(int64(i)), value{k: kLimit, n: int64(i)}
	case kSpends:
		return intVal(int64(i)), value{k: kSpend, n: int64(i)}
	case kConst:
		c := coll.constV()
		return c.keys[i], c.elems[i]
	case kObj:
		o := coll.x.(*dynObj)
		return strVal(o.keys[i]), o.vals[i]
	case kSet:
		e := (*coll.x.(*[]value))[i]
		return e, e
	}
	return undef, undef
}

// equal compares two defined values as Rego does; ok is false when the fast
// path cannot tell (composite values of different representations).
func (m *machine) equal(a, b value) (eq, ok bool) {
	if a.scalar() && b.scalar() {
		return a.k == b.k && a.n == b.n && a.s == b.s, true
	}
	if a.scalar() || b.scalar() {
		return false, true // a scalar never equals a composite
	}
	switch {
	case a.k == kLimit && b.k == kLimit:
		return a.n == b.n || m.in.Limits[a.n] == m.in.Limits[b.n], true
	case a.k == kSpend && b.k == kSpend:
		return a.n == b.n || m.in.Spend[a.n] == m.in.Spend[b.n], true
	case a.k == kConst && b.k == kConst:
		return a.x == b.x, a.x == b.x
	case a.k == kObj && b.k == kObj:
		x, y := a.x.(*dynObj), b.x.(*dynObj)
		if len(x.keys) != len(y.keys) {
			return false, true
		}
		for i, k := range x.keys {
			if y.keys[i] != k {
				return false, true
			}
			if eq, ok := m.equal(x.vals[i], y.vals[i]); !ok || !eq {
				return eq, ok
			}
		}
		return true, true
	}
	return false, false
}

// compare orders two ints or two strings; ok is false otherwise.
func compare(a, b value) (c int, ok bool) {
	switch {
	case a.k == kInt && b.k == kInt:
		switch {
		case a.n < b.n:
			return -1, true
		case a.n > b.n:
			return 1, true
		}
		return 0, true
	case a.k == kStr && b.k == kStr:
		return strings.Compare(a.s, b.s), true
	}
	return 0, false
}

// toJSON converts v to the form the general evaluator returns results in.
func (m *machine) toJSON(v value) (any, bool) {
	switch v.k {
	case kNull:
		return nil, true
	case kBool:
		return v.n == 1, true
	case kInt:
		return json.Number(strconv.FormatInt(v.n, 10)), true
	case kStr:
		return v.s, true
	case kConst:
		return v.constV().json, true
	case kObj:
		o := v.x.(*dynObj)
		out := make(map[string]any, len(o.keys))
		for i, k := range o.keys {
			j, ok := m.toJSON(o.vals[i])
			if !ok {
				return nil, false
			}
			out[k] = j
		}
		return out, true
	case kLimit:
		l := &m.in.Limits[v.n]
		return map[string]any{"name": l.Name, "unit": l.Unit, "limit": jnum(l.Limit), "remaining": jnum(l.Remaining), "reset_seconds": jnum(l.ResetSeconds)}, true
	case kSpend:
		s := &m.in.Spend[v.n]
		return map[string]any{"scope": s.Scope, "period": s.Period, "spent_nano_usd": jnum(s.SpentNanoUSD), "budget_nano_usd": jnum(s.BudgetNanoUSD)}, true
	}
	return nil, false
}

func jnum(n int64) json.Number { return json.Number(strconv.FormatInt(n, 10)) }

func limitField(l *Limit, f string) value {
	switch f {
	case "name":
		return strVal(l.Name)
	case "unit":
		return strVal(l.Unit)
	case "limit":
		return intVal(l.Limit)
	case "remaining":
		return intVal(l.Remaining)
	case "reset_seconds":
		return intVal(l.ResetSeconds)
	}
	return undef
}

func spendField(s *Spend, f string) value {
	switch f {
	case "scope":
		return strVal(s.Scope)
	case "period":
		return strVal(s.Period)
	case "spent_nano_usd":
		return intVal(s.SpentNanoUSD)
	case "budget_nano_usd":
		return intVal(s.BudgetNanoUSD)
	}
	return undef
}

// inputLeaves are the scalar fields of Input, by their path under input.
var inputLeaves = map[string]inputTerm{
	"caller.tenant":             func(in *Input) value { return strVal(in.Caller.Tenant) },
	"caller.user":               func(in *Input) value { return strVal(in.Caller.User) },
	"caller.key_id":             func(in *Input) value { return strVal(in.Caller.KeyID) },
	"caller.plan":               func(in *Input) value { return strVal(in.Caller.Plan) },
	"caller.ip":                 func(in *Input) value { return strVal(in.Caller.IP) },
	"caller.region":             func(in *Input) value { return strVal(in.Caller.Region) },
	"request.route":             func(in *Input) value { return strVal(in.Request.Route) },
	"request.upstream":          func(in *Input) value { return strVal(in.Request.Upstream) },
	"request.model":             func(in *Input) value { return strVal(in.Request.Model) },
	"request.stream":            func(in *Input) value { return boolVal(in.Request.Stream) },
	"request.max_output_tokens": func(in *Input) value { return intVal(in.Request.MaxOutputTokens) },
	"request.page":              func(in *Input) value { return intVal(in.Request.Page) },
	"estimate.input_tokens":     func(in *Input) value { return intVal(in.Estimate.InputTokens) },
	"estimate.output_tokens":    func(in *Input) value { return intVal(in.Estimate.OutputTokens) },
	"estimate.cost_nano_usd":    func(in *Input) value { return intVal(in.Estimate.CostNanoUSD) },
	"limits":                    func(*Input) value { return value{k: kLimits} },
	"spend":                     func(*Input) value { return value{k: kSpends} },
	"time.unix":                 func(in *Input) value { return intVal(in.Time.Unix) },
	"time.hour":                 func(in *Input) value { return intVal(int64(in.Time.Hour)) },
	"time.weekday":              func(in *Input) value { return intVal(int64(in.Time.Weekday)) },
}

// inputObjects are the object-valued paths of input, which the fast path
// does not represent as values.
var inputObjects = map[string]bool{"": true, "caller": true, "request": true, "estimate": true, "time": true}

// ---- arithmetic and builtins ----

func checkedAdd(a, b int64) (int64, bool) {
	c := a + b
	return c, (c > a) == (b > 0) || b == 0
}

func checkedSub(a, b int64) (int64, bool) {
	if b == math.MinInt64 {
		return 0, false
	}
	return checkedAdd(a, -b)
}

func checkedMul(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	hi, lo := bits.Mul64(uint64(abs64(a)), uint64(abs64(b)))
	if hi != 0 || lo > math.MaxInt64 || a == math.MinInt64 || b == math.MinInt64 {
		return 0, false
	}
	c := int64(lo)
	if (a < 0) != (b < 0) {
		c = -c
	}
	return c, true
}

func abs64(a int64) int64 {
	if a < 0 {
		return -a
	}
	return a
}

// builtin computes a function builtin's output; ok false means bail.
type builtin func(m *machine, args []value) (out value, ok bool)

var builtins = map[string]builtin{
	"plus": func(_ *machine, a []value) (value, bool) {
		if a[0].k != kInt || a[1].k != kInt {
			return undef, false
		}
		c, ok := checkedAdd(a[0].n, a[1].n)
		return intVal(c), ok
	},
	"minus": func(_ *machine, a []value) (value, bool) {
		if a[0].k != kInt || a[1].k != kInt {
			return undef, false // also set difference: the general evaluator does it
		}
		c, ok := checkedSub(a[0].n, a[1].n)
		return intVal(c), ok
	},
	"mul": func(_ *machine, a []value) (value, bool) {
		if a[0].k != kInt || a[1].k != kInt {
			return undef, false
		}
		c, ok := checkedMul(a[0].n, a[1].n)
		return intVal(c), ok
	},
	"div": func(_ *machine, a []value) (value, bool) {
		x, y := a[0], a[1]
		// As in OPA, only a non-zero dividend that the divisor divides gives
		// an integer; anything else is a floating-point quotient (0/-1 is -0).
		if x.k != kInt || y.k != kInt || y.n == 0 || x.n == 0 || x.n%y.n != 0 || (x.n == math.MinInt64 && y.n == -1) {
			return undef, false
		}
		return intVal(x.n / y.n), true
	},
	"rem": func(_ *machine, a []value) (value, bool) {
		x, y := a[0], a[1]
		if x.k != kInt || y.k != kInt || y.n == 0 { // Go's % truncates, as big.Int.Rem does
			return undef, false
		}
		return intVal(x.n % y.n), true
	},
	"count": func(m *machine, a []value) (value, bool) {
		switch a[0].k {
		case kStr:
			return intVal(int64(utf8.RuneCountInString(a[0].s))), true
		case kLimits, kSpends, kConst, kObj:
			return intVal(int64(m.size(a[0]))), true
		}
		return undef, false // partial sets may hold duplicates until deduplicated
	},
	"sprintf": nil, // compiled specially: its second argument is an array
}

// tests are builtins that succeed or fail.
type test func(m *machine, args []value) (holds, ok bool)

var tests = map[string]test{
	"equal": func(m *machine, a []value) (bool, bool) { return m.equal(a[0], a[1]) },
	"neq": func(m *machine, a []value) (bool, bool) {
		eq, ok := m.equal(a[0], a[1])
		return !eq, ok
	},
	"lt":         cmpTest(func(c int) bool { return c < 0 }),
	"lte":        cmpTest(func(c int) bool { return c <= 0 }),
	"gt":         cmpTest(func(c int) bool { return c > 0 }),
	"gte":        cmpTest(func(c int) bool { return c >= 0 }),
	"startswith": strTest(strings.HasPrefix),
	"endswith":   strTest(strings.HasSuffix),
	"contains":   strTest(strings.Contains),
	"internal.member_2": func(m *machine, a []value) (bool, bool) {
		x, coll := a[0], a[1]
		if coll.k == kConst {
			if c := coll.constV(); c.strs != nil && x.k == kStr {
				return c.strs[x.s], true
			}
		}
		n := m.size(coll)
		if n < 0 {
			return false, coll.scalar() // membership in a scalar is undefined... let the general evaluator decide
		}
		for i := range n {
			_, e := m.elem(coll, i)
			eq, ok := m.equal(x, e)
			if !ok {
				return false, false
			}
			if eq {
				return true, true
			}
		}
		return false, true
	},
}

func cmpTest(f func(int) bool) test {
	return func(_ *machine, a []value) (bool, bool) {
		c, ok := compare(a[0], a[1])
		return ok && f(c), ok
	}
}

func strTest(f func(string, string) bool) test {
	return func(_ *machine, a []value) (bool, bool) {
		if a[0].k != kStr || a[1].k != kStr {
			return false, false
		}
		return f(a[0].s, a[1].s), true
	}
}

// sprintfValue formats like OPA's sprintf: integers as int64, strings as
// strings, booleans and null by their Rego text.
func sprintfValue(format value, args []value) (value, bool) {
	if format.k != kStr {
		return undef, false
	}
	xs := make([]any, len(args))
	for i, a := range args {
		switch a.k {
		case kInt:
			xs[i] = a.n
		case kStr:
			xs[i] = a.s
		case kBool:
			xs[i] = strconv.FormatBool(a.n == 1)
		case kNull:
			xs[i] = "null"
		default:
			return undef, false
		}
	}
	return strVal(fmt.Sprintf(format.s, xs...)), true
}

// ---- steps ----

// callStep evaluates args, then either tests or computes an output which it
// binds to a slot (out >= 0) or compares with a term (outTerm).
type callStep struct {
	name    string
	args    []cterm
	test    test
	fn      builtin
	sprintf bool
	out     int
	outTerm cterm
}

func (c *callStep) first(m *machine, fr []value) bool {
	var buf [4]value
	args := buf[:0]
	for _, a := range c.args {
		v := a.eval(m, fr)
		if v.k == kUndef {
			return false
		}
		args = append(args, v)
	}
	if c.test != nil {
		holds, ok := c.test(m, args)
		if !ok {
			m.bailOut(c.name)
			return false
		}
		if c.out < 0 && c.outTerm == nil {
			return holds
		}
		out := boolVal(holds)
		if c.out >= 0 {
			fr[c.out] = out
			return true
		}
		want := c.outTerm.eval(m, fr)
		if want.k == kUndef {
			return false
		}
		eq, ok := m.equal(out, want)
		if !ok {
			m.bailOut(c.name)
		}
		return eq
	}
	var out value
	var ok bool
	if c.sprintf {
		out, ok = sprintfValue(args[0], args[1:])
	} else {
		out, ok = c.fn(m, args)
	}
	if !ok {
		m.bailOut(c.name)
		return false
	}
	if c.out >= 0 {
		fr[c.out] = out
		return true
	}
	want := c.outTerm.eval(m, fr)
	if want.k == kUndef {
		return false
	}
	eq, ok := m.equal(out, want)
	if !ok {
		m.bailOut(c.name)
	}
	return eq
}

func (*callStep) next(*machine, []value) bool { return false }

// bindStep binds slot to a term's value.
type bindStep struct {
	slot int
	t    cterm
}

func (b *bindStep) first(m *machine, fr []value) bool {
	v := b.t.eval(m, fr)
	fr[b.slot] = v
	return v.k != kUndef
}

func (*bindStep) next(*machine, []value) bool { return false }

// eqStep compares two terms.
type eqStep struct{ a, b cterm }

func (e *eqStep) first(m *machine, fr []value) bool {
	a := e.a.eval(m, fr)
	if a.k == kUndef {
		return false
	}
	b := e.b.eval(m, fr)
	if b.k == kUndef {
		return false
	}
	eq, ok := m.equal(a, b)
	if !ok {
		m.bailOut("equality of composite values")
	}
	return eq
}

func (*eqStep) next(*machine, []value) bool { return false }

// truthStep holds when a term is defined and not false.
type truthStep struct{ t cterm }

func (s *truthStep) first(m *machine, fr []value) bool { return s.t.eval(m, fr).truthy() }
func (*truthStep) next(*machine, []value) bool         { return false }

// notStep holds when its body has no solution.
type notStep struct{ body []step }

func (s *notStep) first(m *machine, fr []value) bool {
	ok := m.solve(s.body, fr, false)
	return !ok && !m.bail
}

func (*notStep) next(*machine, []value) bool { return false }

// iterStep enumerates coll[key].path..., binding key (a slot) and unifying
// each value with the target: binding slot target, comparing with
// targetTerm, or (neither) testing truth.
type iterStep struct {
	coll       cterm
	key        int
	path       []cterm
	target     int
	targetTerm cterm
	counter    int // slot holding the next index, as an int value
	collSlot   int // slot holding the collection
}

func (s *iterStep) first(m *machine, fr []value) bool {
	c := s.coll.eval(m, fr)
	fr[s.collSlot] = c
	fr[s.counter] = intVal(0)
	return s.next(m, fr)
}

func (s *iterStep) next(m *machine, fr []value) bool {
	c := fr[s.collSlot]
	n := m.size(c)
	for i := int(fr[s.counter].n); i < n; i++ {
		k, v := m.elem(c, i)
		fr[s.key] = k
		for _, p := range s.path {
			if v.k == kUndef {
				break
			}
			v = m.get(v, p.eval(m, fr))
		}
		if m.bail {
			return false
		}
		if v.k == kUndef {
			continue
		}
		switch {
		case s.target >= 0:
			fr[s.target] = v
		case s.targetTerm != nil:
			want := s.targetTerm.eval(m, fr)
			if want.k == kUndef {
				continue
			}
			eq, ok := m.equal(v, want)
			if !ok {
				m.bailOut("equality of composite values")
				return false
			}
			if !eq {
				continue
			}
		default:
			if !v.truthy() {
				continue
			}
		}
		fr[s.counter] = intVal(int64(i + 1))
		return true
	}
	return false
}

// ---- the compiler ----

// compileFast compiles the rule at ref and everything it depends on into p.
// It returns nil, with the reason, when the rule needs the general
// evaluator.
func (p *program) compileFast(ref ast.Ref) (*fastRule, error) {
	r, err := p.rule(ref)
	if err != nil {
		return nil, err
	}
	return &fastRule{p: p, r: r}, nil
}

func newProgram(c *ast.Compiler) *program {
	return &program{byRef: map[string]*crule{}, failed: map[string]error{}, c: c}
}

// rule compiles the rule at ref (a ground data reference).
func (p *program) rule(ref ast.Ref) (*crule, error) {
	key := ref.String()
	if err, ok := p.failed[key]; ok {
		return nil, err
	}
	r, err := p.compileRule(ref, key)
	if err != nil {
		p.failed[key] = err
		delete(p.byRef, key)
	}
	return r, err
}

func (p *program) compileRule(ref ast.Ref, key string) (*crule, error) {
	if r, ok := p.byRef[key]; ok {
		if r == nil {
			return nil, unsupported("%s depends on itself", key)
		}
		return r, nil
	}
	p.byRef[key] = nil
	rules := p.c.GetRulesExact(ref)
	if len(rules) == 0 {
		return nil, unsupported("%s is not a rule", ref)
	}
	if n := len(p.c.GetRulesWithPrefix(ref)); n != len(rules) {
		return nil, unsupported("%s is extended by rules with longer references", ref)
	}
	cr := &crule{name: key, sameHead: true}
	var first *ast.Term
	for _, r := range rules {
		if len(r.Head.Args) > 0 {
			return nil, unsupported("%s is a function", ref)
		}
		if len(r.Head.Ref()) != 1 {
			return nil, unsupported("%s has a reference head", ref)
		}
		multi := r.Head.RuleKind() == ast.MultiValue
		if multi {
			cr.multi = true
		}
		if r.Default {
			v, err := constOf(r.Head.Value.Value)
			if err != nil {
				return nil, err
			}
			cr.deflt = &v
			continue
		}
		var chain []*level
		for e := r; e != nil; e = e.Else {
			l, err := p.level(e, multi)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ref, err)
			}
			chain = append(chain, l)
		}
		if len(chain) > 1 || !chain[0].ghead || multi {
			cr.sameHead = false
		} else if first == nil {
			first = r.Head.Value
		} else if !first.Equal(r.Head.Value) {
			cr.sameHead = false
		}
		cr.defs = append(cr.defs, chain)
	}
	if cr.multi && cr.deflt != nil {
		return nil, unsupported("%s: default on a partial set", ref)
	}
	for _, chain := range cr.defs {
		for _, l := range chain {
			cr.slots = max(cr.slots, l.slots)
		}
	}
	cr.idx = len(p.rules)
	p.rules = append(p.rules, cr)
	p.byRef[key] = cr
	p.slots += cr.slots
	return cr, nil
}

// scope maps a rule body's variables to frame slots.
type scope struct {
	slots map[ast.Var]int
	bound map[ast.Var]bool
	n     *int
}

func (s *scope) slot(v ast.Var) int {
	if i, ok := s.slots[v]; ok {
		return i
	}
	i := *s.n
	*s.n++
	s.slots[v] = i
	return i
}

func (s *scope) fresh() int {
	i := *s.n
	*s.n++
	return i
}

// sub returns a scope for a negated body: the same slots, its own bindings.
func (s *scope) sub() *scope {
	b := make(map[ast.Var]bool, len(s.bound))
	for k, v := range s.bound {
		b[k] = v
	}
	return &scope{slots: s.slots, bound: b, n: s.n}
}

func (p *program) level(r *ast.Rule, multi bool) (*level, error) {
	n := 0
	sc := &scope{slots: map[ast.Var]int{}, bound: map[ast.Var]bool{}, n: &n}
	body, err := p.body(r.Body, sc)
	if err != nil {
		return nil, err
	}
	headTerm := r.Head.Value
	if multi {
		headTerm = r.Head.Key
	}
	if headTerm == nil {
		return nil, unsupported("rule without value")
	}
	head, err := p.term(headTerm, sc)
	if err != nil {
		return nil, err
	}
	_, ghead := head.(constTerm)
	return &level{slots: n, body: body, head: head, ghead: ghead}, nil
}

func (p *program) body(b ast.Body, sc *scope) ([]step, error) {
	var steps []step
	for _, e := range b {
		s, err := p.expr(e, sc)
		if err != nil {
			return nil, err
		}
		if s != nil {
			steps = append(steps, s)
		}
	}
	return steps, nil
}

func (p *program) expr(e *ast.Expr, sc *scope) (step, error) {
	if len(e.With) > 0 {
		return nil, unsupported("with at %v", e.Location)
	}
	if e.Negated {
		inner := e.Copy()
		inner.Negated = false
		sub := sc.sub()
		s, err := p.expr(inner, sub)
		if err != nil {
			return nil, err
		}
		return &notStep{body: []step{s}}, nil
	}
	switch t := e.Terms.(type) {
	case *ast.Term:
		if b, ok := t.Value.(ast.Boolean); ok {
			if b {
				return nil, nil
			}
			return det{func(*machine, []value) bool { return false }}, nil
		}
		if ref, ok := t.Value.(ast.Ref); ok {
			if j := p.unboundIn(ref, sc); j >= 0 {
				return p.iter(ref, j, -1, nil, sc)
			}
		}
		ct, err := p.term(t, sc)
		if err != nil {
			return nil, err
		}
		return &truthStep{t: ct}, nil
	case []*ast.Term:
		if e.IsEquality() {
			return p.unify(t[1], t[2], sc)
		}
		return p.call(e, sc)
	}
	return nil, unsupported("expression %v", e)
}

// unboundIn returns the index of the first unbound variable in ref's path,
// or -1.
func (p *program) unboundIn(ref ast.Ref, sc *scope) int {
	for i, t := range ref {
		if i == 0 {
			continue
		}
		if v, ok := t.Value.(ast.Var); ok && !sc.bound[v] {
			return i
		}
	}
	return -1
}

func (p *program) isUnboundVar(t *ast.Term, sc *scope) (ast.Var, bool) {
	v, ok := t.Value.(ast.Var)
	if !ok || sc.bound[v] {
		return "", false
	}
	return v, true
}

func (p *program) unify(a, b *ast.Term, sc *scope) (step, error) {
	va, aFree := p.isUnboundVar(a, sc)
	vb, bFree := p.isUnboundVar(b, sc)
	if aFree && bFree {
		return nil, unsupported("unification of two unbound variables")
	}
	if bFree {
		a, b, va, aFree = b, a, vb, true
	}
	// Now: a may be an unbound variable; b is not.
	if ref, ok := b.Value.(ast.Ref); ok {
		if j := p.unboundIn(ref, sc); j >= 0 {
			if aFree {
				target := sc.slot(va)
				s, err := p.iter(ref, j, target, nil, sc)
				sc.bound[va] = true
				return s, err
			}
			at, err := p.term(a, sc)
			if err != nil {
				return nil, err
			}
			return p.iter(ref, j, -1, at, sc)
		}
	}
	if ref, ok := a.Value.(ast.Ref); ok && p.unboundIn(ref, sc) >= 0 {
		return nil, unsupported("unification with a generated reference on both sides")
	}
	bt, err := p.term(b, sc)
	if err != nil {
		return nil, err
	}
	if aFree {
		s := &bindStep{slot: sc.slot(va), t: bt}
		sc.bound[va] = true
		return s, nil
	}
	at, err := p.term(a, sc)
	if err != nil {
		return nil, err
	}
	return &eqStep{a: at, b: bt}, nil
}

// iter compiles the enumeration of ref, whose j-th element is an unbound
// variable.
func (p *program) iter(ref ast.Ref, j, target int, targetTerm cterm, sc *scope) (step, error) {
	coll, err := p.ref(ref[:j], sc)
	if err != nil {
		return nil, err
	}
	kv := ref[j].Value.(ast.Var)
	s := &iterStep{coll: coll, key: sc.slot(kv), target: target, targetTerm: targetTerm, counter: sc.fresh(), collSlot: sc.fresh()}
	sc.bound[kv] = true
	for _, t := range ref[j+1:] {
		if v, ok := t.Value.(ast.Var); ok && !sc.bound[v] {
			return nil, unsupported("reference %v enumerates more than one variable", ref)
		}
		ct, err := p.term(t, sc)
		if err != nil {
			return nil, err
		}
		s.path = append(s.path, ct)
	}
	return s, nil
}

func (p *program) call(e *ast.Expr, sc *scope) (step, error) {
	name := e.Operator().String()
	ops := e.Operands()
	var args []*ast.Term
	c := &callStep{name: name, out: -1}
	if t, ok := tests[name]; ok && (len(ops) == 2 || len(ops) == 3) {
		c.test = t
		args = ops[:2]
		if len(ops) == 3 {
			out := ops[2]
			if v, free := p.isUnboundVar(out, sc); free {
				defer func() { c.out = sc.slot(v); sc.bound[v] = true }()
			} else {
				ot, err := p.term(out, sc)
				if err != nil {
					return nil, err
				}
				c.outTerm = ot
			}
		}
	} else if f, ok := builtins[name]; ok {
		var decl *ast.Builtin
		if decl = ast.BuiltinMap[name]; decl == nil || len(ops) != len(decl.Decl.FuncArgs().Args)+1 {
			return nil, unsupported("call %v", e)
		}
		args = ops[:len(ops)-1]
		c.fn = f
		if name == "sprintf" {
			arr, ok := ops[1].Value.(*ast.Array)
			if !ok {
				return nil, unsupported("sprintf with a non-literal argument list")
			}
			c.sprintf = true
			args = []*ast.Term{ops[0]}
			for i := range arr.Len() {
				args = append(args, arr.Elem(i))
			}
		}
		out := ops[len(ops)-1]
		if v, free := p.isUnboundVar(out, sc); free {
			defer func() { c.out = sc.slot(v); sc.bound[v] = true }()
		} else {
			ot, err := p.term(out, sc)
			if err != nil {
				return nil, err
			}
			c.outTerm = ot
		}
	} else {
		return nil, unsupported("call %v", e)
	}
	for _, a := range args {
		ct, err := p.term(a, sc)
		if err != nil {
			return nil, err
		}
		c.args = append(c.args, ct)
	}
	return c, nil
}

// term compiles a term whose variables are all bound.
func (p *program) term(t *ast.Term, sc *scope) (cterm, error) {
	switch v := t.Value.(type) {
	case ast.Var:
		if !sc.bound[v] {
			return nil, unsupported("unbound variable %v", v)
		}
		return slotTerm(sc.slot(v)), nil
	case ast.Ref:
		return p.ref(v, sc)
	case ast.Object:
		if ast.IsConstant(v) {
			c, err := constOf(v)
			return constTerm{c}, err
		}
		o := objTerm{}
		type kv struct {
			k string
			t *ast.Term
		}
		var items []kv
		var err error
		v.Foreach(func(k, x *ast.Term) {
			s, ok := k.Value.(ast.String)
			if !ok && err == nil {
				err = unsupported("object key %v", k)
			}
			items = append(items, kv{string(s), x})
		})
		if err != nil {
			return nil, err
		}
		sort.Slice(items, func(i, j int) bool { return items[i].k < items[j].k })
		for _, it := range items {
			ct, err := p.term(it.t, sc)
			if err != nil {
				return nil, err
			}
			o.keys = append(o.keys, it.k)
			o.vals = append(o.vals, ct)
		}
		return o, nil
	}
	if ast.IsConstant(t.Value) {
		c, err := constOf(t.Value)
		return constTerm{c}, err
	}
	return nil, unsupported("term %v", t)
}

// ref compiles a reference whose variables are all bound.
func (p *program) ref(ref ast.Ref, sc *scope) (cterm, error) {
	if len(ref) == 0 {
		return nil, unsupported("empty reference")
	}
	switch h := ref[0].Value.(type) {
	case ast.Var:
		switch {
		case h.Equal(ast.InputRootDocument.Value):
			return p.inputRef(ref, sc)
		case h.Equal(ast.DefaultRootDocument.Value):
			return p.dataRef(ref, sc)
		}
		if !sc.bound[h] {
			return nil, unsupported("unbound variable %v", h)
		}
		return p.path(slotTerm(sc.slot(h)), ref[1:], sc)
	}
	return nil, unsupported("reference %v", ref)
}

func (p *program) path(base cterm, rest ast.Ref, sc *scope) (cterm, error) {
	if len(rest) == 0 {
		return base, nil
	}
	pt := pathTerm{base: base}
	for _, t := range rest {
		ct, err := p.term(t, sc)
		if err != nil {
			return nil, err
		}
		pt.path = append(pt.path, ct)
	}
	return pt, nil
}

func (p *program) inputRef(ref ast.Ref, sc *scope) (cterm, error) {
	var parts []string
	i := 1
	for ; i < len(ref) && len(parts) < 2; i++ {
		s, ok := ref[i].Value.(ast.String)
		if !ok {
			break
		}
		parts = append(parts, string(s))
		if f, ok := inputLeaves[strings.Join(parts, ".")]; ok {
			return p.path(f, ref[i+1:], sc)
		}
	}
	if inputObjects[strings.Join(parts, ".")] {
		return nil, unsupported("%v is an object", ref)
	}
	return constTerm{undef}, nil // not in the schema: undefined, as in Rego
}

func (p *program) dataRef(ref ast.Ref, sc *scope) (cterm, error) {
	for n := len(ref); n >= 2; n-- {
		prefix := ref[:n]
		if !prefix.IsGround() {
			continue
		}
		if len(p.c.GetRulesExact(prefix)) == 0 {
			continue
		}
		r, err := p.rule(prefix)
		if err != nil {
			return nil, err
		}
		return p.path(ruleTerm{r}, ref[n:], sc)
	}
	return nil, unsupported("%v is not a rule", ref)
}
