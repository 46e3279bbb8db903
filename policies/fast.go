package policies

// The fast path.
//
// The general Rego evaluator (topdown) spends most of a decision converting
// the input to ast values, allocating bindings and caches, and converting the
// result back: 900 to 2000 allocations for the example policies. Policies of
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
// object comprehensions, function argument patterns, most builtins) make the
// whole policy use the general evaluator, decided once at load time. TestFastPathEqualsRego
// compares both on randomized inputs.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

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

// machine is the state of one decision. Machines are pooled per program.
type machine struct {
	in    *Input
	state []uint8 // per rule: ruleTodo, ruleBusy, ruleDone or ruleBailed
	vals  []value // per rule: its value once done
	sets  [][]value
	stack []value
	top   int
	argv  []value // a stack of call arguments; see args
	bail  bool
	why   string // what made the machine bail, for tests and debugging
}

// args evaluates terms onto the argument stack and returns them, with ok
// false when one is undefined. The caller must pop them with
// m.argv = m.argv[:base] on every path. (A local array would escape to the
// heap through the builtin's function value, one allocation per call.)
func (m *machine) args(terms []cterm, fr []value) (args []value, base int, ok bool) {
	base = len(m.argv)
	for _, t := range terms {
		v := t.eval(m, fr) // may evaluate rules, which push and pop above
		if v.k == kUndef {
			m.argv = m.argv[:base]
			return nil, base, false
		}
		m.argv = append(m.argv, v)
	}
	top := len(m.argv)
	return m.argv[base:top:top], base, true
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
		m = &machine{stack: make([]value, p.slots)}
	}
	n := len(p.rules)
	if len(m.state) < n {
		m.state = make([]uint8, n)
		m.vals = make([]value, n)
		m.sets = make([][]value, n)
	}
	clear(m.state)
	m.in, m.top, m.bail, m.why = in, 0, false, ""
	m.argv = m.argv[:0]
	return m
}

// release returns m to the pool, dropping its references to the input and
// to the values built from it.
func (p *program) release(m *machine) {
	m.in = nil
	clear(m.vals)
	clear(m.stack)
	clear(m.argv[:cap(m.argv)])
	for i, members := range m.sets {
		clear(members[:cap(members)])
		m.sets[i] = members[:0]
	}
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
	fn       bool // a function: evaluated per call, never cached
	nargs    int
}

type level struct {
	slots int
	args  []int // functions: the slots of the arguments
	body  []step
	head  cterm // complete rules: the value; partial sets: the member
	ghead bool  // head is a constant
}

// fastRule is a compiled decision rule.
type fastRule struct {
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
		m.bailOut("ill-formed decision") // the general evaluator reports the error
		return verdict{}, false, errBail
	}
	j, ok := m.toJSON(v)
	if !ok {
		m.bailOut("decision is not a JSON value")
		return verdict{}, false, errBail
	}
	dv, derr := decodeVerdict(j)
	if derr != nil {
		m.bailOut("ill-formed decision")
		return verdict{}, false, errBail
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
		v = m.evalComplete(r, fr, nil)
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

// evalComplete evaluates a complete rule or, with its arguments, a
// function.
func (m *machine) evalComplete(r *crule, fr []value, args []value) value {
	result := undef
	for _, chain := range r.defs {
		for _, l := range chain {
			for i, s := range l.args {
				fr[s] = args[i]
			}
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

// compTerm is an array or set comprehension: the values of head over
// every solution of body.
type compTerm struct {
	body []step
	head cterm
	set  bool
}

func (t compTerm) eval(m *machine, fr []value) value {
	list := new([]value)
	ok := m.solve(t.body, fr, false)
	for ok && !m.bail {
		if v := t.head.eval(m, fr); v.k != kUndef {
			*list = append(*list, v)
		}
		ok = m.solve(t.body, fr, true)
	}
	if m.bail {
		return undef
	}
	if t.set {
		return value{k: kSet, x: list}
	}
	return value{k: kArr, x: list}
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

// Steps.

// callStep evaluates args, then either tests or computes an output which it
// binds to a slot (out >= 0) or compares with a term (outTerm).
type callStep struct {
	name    string
	truth   bool // called without its output: holds when the value is truthy
	args    []cterm
	test    test
	fn      builtin
	sprintf bool
	out     int
	outTerm cterm
}

func (c *callStep) first(m *machine, fr []value) bool {
	args, base, ok := m.args(c.args, fr)
	if !ok {
		return false
	}
	var out value
	switch {
	case c.test != nil:
		var holds bool
		holds, ok = c.test(m, args)
		out = boolVal(holds)
	case c.sprintf:
		out, ok = sprintfValue(args[0], args[1:])
	default:
		out, ok = c.fn(m, args)
	}
	m.argv = m.argv[:base]
	if !ok {
		m.bailOut(c.name)
		return false
	}
	if out.k == kUndef {
		return false // e.g. max of an empty array
	}
	if c.truth {
		return out.truthy()
	}
	return m.output(out, c.out, c.outTerm, fr, c.name)
}

// output binds v to slot out (out >= 0) or compares it with the term want.
// The comparison bails out, naming why, when it cannot be decided.
func (m *machine) output(v value, out int, want cterm, fr []value, why string) bool {
	if out >= 0 {
		fr[out] = v
		return true
	}
	w := want.eval(m, fr)
	if w.k == kUndef {
		return false
	}
	eq, ok := m.equal(v, w)
	if !ok {
		m.bailOut(why)
	}
	return eq
}

func (*callStep) next(*machine, []value) bool { return false }

// call evaluates function f on args.
func (m *machine) call(f *crule, args []value) value {
	top := m.top
	fr := m.frame(f.slots)
	v := m.evalComplete(f, fr, args)
	m.top = top
	return v
}

// funcStep calls a user-defined function: as a test (the value is defined
// and not false), or binding or comparing its value.
type funcStep struct {
	f       *crule
	args    []cterm
	test    bool
	out     int
	outTerm cterm
}

func (c *funcStep) first(m *machine, fr []value) bool {
	args, base, ok := m.args(c.args, fr)
	if !ok {
		return false
	}
	v := m.call(c.f, args)
	m.argv = m.argv[:base]
	if m.bail || v.k == kUndef {
		return false
	}
	if c.test {
		return v.truthy()
	}
	return m.output(v, c.out, c.outTerm, fr, "equality of composite values")
}

func (*funcStep) next(*machine, []value) bool { return false }

// everyStep holds when its body has a solution for every element of the
// domain.
type everyStep struct {
	domain   cterm
	key, val int // slots; key is -1 when the every has no key
	body     []step
}

func (s *everyStep) first(m *machine, fr []value) bool {
	d := s.domain.eval(m, fr)
	if d.k == kUndef {
		return false
	}
	n := m.size(d)
	if n < 0 {
		m.bailOut("every over a scalar")
		return false
	}
	for i := range n {
		k, v := m.elem(d, i)
		if s.key >= 0 {
			fr[s.key] = k
		}
		fr[s.val] = v
		if !m.solve(s.body, fr, false) {
			return false
		}
	}
	return !m.bail
}

func (*everyStep) next(*machine, []value) bool { return false }

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
	if c.k == kLimit || c.k == kSpend {
		// An object to Rego, whose fields the fast path does not enumerate
		// (m.size is -1): iterating it must not find nothing.
		m.bailOut("iteration over the fields of an input object")
		return false
	}
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
