package policies

// Values of the fast path: scalars inline, composites by pointer.

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

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
	kSet                // x.(*[]value), the members of a partial set rule or set comprehension, with repeats
	kArr                // x.(*[]value), the elements of an array comprehension
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
	case kArr:
		if es := *coll.x.(*[]value); key.k == kInt && key.n >= 0 && key.n < int64(len(es)) {
			return es[key.n]
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
	case kSet, kArr:
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
	case kArr:
		return intVal(int64(i)), (*coll.x.(*[]value))[i]
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
	case a.k == kArr && b.k == kArr:
		x, y := *a.x.(*[]value), *b.x.(*[]value)
		if len(x) != len(y) {
			return false, true
		}
		for i := range x {
			if eq, ok := m.equal(x[i], y[i]); !ok || !eq {
				return eq, ok
			}
		}
		return true, true
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
	"estimate.output_basis":     func(in *Input) value { return strVal(in.Estimate.OutputBasis) },
	"estimate.output_quantile":  func(in *Input) value { return strVal(in.Estimate.OutputQuantile) },
	"estimate.output_samples":   func(in *Input) value { return intVal(in.Estimate.OutputSamples) },
	"limits":                    func(*Input) value { return value{k: kLimits} },
	"spend":                     func(*Input) value { return value{k: kSpends} },
	"time.unix":                 func(in *Input) value { return intVal(in.Time.Unix) },
	"time.hour":                 func(in *Input) value { return intVal(int64(in.Time.Hour)) },
	"time.weekday":              func(in *Input) value { return intVal(int64(in.Time.Weekday)) },
}

// inputObjects are the object-valued paths of input, which the fast path
// does not represent as values.
var inputObjects = map[string]bool{"": true, "caller": true, "request": true, "estimate": true, "time": true,
	// A policy that reads the reserve API's attributes, or the other
	// models a request may run, runs on OPA.
	"request.attributes": true, "request.other_models": true}
