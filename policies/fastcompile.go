package policies

// The compiler of the fast path: from the OPA compiler's rewritten rules to
// steps and terms. Anything it does not know is errUnsupported, and the
// policy stays on the general evaluator.

import (
	"fmt"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// compileFast compiles the rule at ref and everything it depends on into p.
// It returns nil, with the reason, when the rule needs the general
// evaluator.
func (p *program) compileFast(ref ast.Ref) (*fastRule, error) {
	r, err := p.rule(ref)
	if err != nil {
		return nil, err
	}
	return &fastRule{r: r}, nil
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
	cr := &crule{name: key, sameHead: true, nargs: len(rules[0].Head.Args)}
	cr.fn = cr.nargs > 0
	var first *ast.Term
	for _, r := range rules {
		if len(r.Head.Args) != cr.nargs {
			return nil, unsupported("%s is defined with different numbers of arguments", ref)
		}
		if cr.fn && r.Default {
			return nil, unsupported("%s is a default function", ref)
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
	var args []int
	for _, a := range r.Head.Args {
		v, ok := a.Value.(ast.Var)
		if !ok || sc.bound[v] {
			return nil, unsupported("function argument %v is not a plain variable", a)
		}
		args = append(args, sc.slot(v))
		sc.bound[v] = true
	}
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
	return &level{slots: n, args: args, body: body, head: head, ghead: ghead}, nil
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
	case *ast.Every:
		return p.every(t, sc)
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

// every compiles `every k, v in domain { body }`.
func (p *program) every(ev *ast.Every, sc *scope) (step, error) {
	domain, err := p.term(ev.Domain, sc)
	if err != nil {
		return nil, err
	}
	sub := sc.sub()
	s := &everyStep{domain: domain, key: -1}
	if ev.Key != nil {
		v, ok := p.isUnboundVar(ev.Key, sub)
		if !ok {
			return nil, unsupported("every with a key pattern %v", ev.Key)
		}
		s.key = sub.slot(v)
		sub.bound[v] = true
	}
	v, ok := p.isUnboundVar(ev.Value, sub)
	if !ok {
		return nil, unsupported("every with a value pattern %v", ev.Value)
	}
	s.val = sub.slot(v)
	sub.bound[v] = true
	if s.body, err = p.body(ev.Body, sub); err != nil {
		return nil, err
	}
	return s, nil
}

// funcCall compiles a call of a user-defined function, as a test
// (f(x)) or with an output (f(x, y), y := f(x)).
func (p *program) funcCall(op ast.Ref, ops []*ast.Term, sc *scope) (step, error) {
	f, err := p.rule(op)
	if err != nil {
		return nil, err
	}
	if !f.fn {
		return nil, unsupported("call of %v, which is not a function", op)
	}
	if len(ops) != f.nargs && len(ops) != f.nargs+1 {
		return nil, unsupported("call of %v with %d arguments", op, len(ops))
	}
	c := &funcStep{f: f, out: -1, test: len(ops) == f.nargs}
	if c.args, err = p.terms(ops[:f.nargs], sc); err != nil {
		return nil, err
	}
	if !c.test {
		c.out, c.outTerm, err = p.output(ops[f.nargs], sc)
	}
	return c, err
}

// terms compiles the arguments of a call.
func (p *program) terms(ts []*ast.Term, sc *scope) ([]cterm, error) {
	out := make([]cterm, 0, len(ts))
	for _, t := range ts {
		ct, err := p.term(t, sc)
		if err != nil {
			return nil, err
		}
		out = append(out, ct)
	}
	return out, nil
}

// output compiles the output operand of a call, after its arguments: an
// unbound variable gets the slot the call binds; any other term is what
// the call's value is compared with (slot -1).
func (p *program) output(t *ast.Term, sc *scope) (slot int, want cterm, err error) {
	if v, free := p.isUnboundVar(t, sc); free {
		slot = sc.slot(v)
		sc.bound[v] = true
		return slot, nil, nil
	}
	want, err = p.term(t, sc)
	return -1, want, err
}

func (p *program) call(e *ast.Expr, sc *scope) (step, error) {
	op := e.Operator()
	ops := e.Operands()
	if len(op) > 1 && op[0].Value.Compare(ast.DefaultRootDocument.Value) == 0 {
		return p.funcCall(op, ops, sc)
	}
	name := op.String()
	var args []*ast.Term
	var out *ast.Term // the output operand, if any
	c := &callStep{name: name, out: -1}
	if t, ok := tests[name]; ok && (len(ops) == 2 || len(ops) == 3) {
		c.test = t
		args = ops[:2]
		if len(ops) == 3 {
			out = ops[2]
		}
	} else if f, ok := builtins[name]; ok {
		decl := ast.BuiltinMap[name]
		if decl == nil {
			return nil, unsupported("call %v", e)
		}
		nargs := len(decl.Decl.FuncArgs().Args)
		switch len(ops) {
		case nargs: // f(x) as an expression: holds when the value is truthy
			args = ops
		case nargs + 1:
			args = ops[:nargs]
			out = ops[nargs]
		default:
			return nil, unsupported("call %v", e)
		}
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
	} else {
		return nil, unsupported("call %v", e)
	}
	var err error
	if c.args, err = p.terms(args, sc); err != nil {
		return nil, err
	}
	c.truth = out == nil
	if out != nil {
		c.out, c.outTerm, err = p.output(out, sc)
	}
	return c, err
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
	case *ast.ArrayComprehension:
		return p.comprehension(v.Body, v.Term, false, sc)
	case *ast.SetComprehension:
		return p.comprehension(v.Body, v.Term, true, sc)
	}
	if ast.IsConstant(t.Value) {
		c, err := constOf(t.Value)
		return constTerm{c}, err
	}
	return nil, unsupported("term %v", t)
}

// comprehension compiles [head | body] or {head | body}; the body sees the
// enclosing bindings and binds its own.
func (p *program) comprehension(body ast.Body, head *ast.Term, set bool, sc *scope) (cterm, error) {
	sub := sc.sub()
	steps, err := p.body(body, sub)
	if err != nil {
		return nil, err
	}
	h, err := p.term(head, sub)
	if err != nil {
		return nil, err
	}
	return compTerm{body: steps, head: h, set: set}, nil
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
