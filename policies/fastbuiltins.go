package policies

// The builtins of the fast path. Each reproduces OPA's builtin exactly on
// the values it accepts and reports ok false (bail out) on any other.

import (
	"fmt"
	"math"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"
)

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
		case kLimits, kSpends, kConst, kObj, kArr:
			return intVal(int64(m.size(a[0]))), true
		case kSet:
			// The members of a partial set are collected with repeats;
			// count the distinct ones.
			members := *a[0].x.(*[]value)
			n := 0
		next:
			for i, x := range members {
				for _, y := range members[:i] {
					eq, ok := m.equal(x, y)
					if !ok {
						return undef, false
					}
					if eq {
						continue next
					}
				}
				n++
			}
			return intVal(int64(n)), true
		}
		return undef, false
	},
	"sum": func(m *machine, a []value) (value, bool) {
		var total int64
		ok := m.eachDistinct(a[0], func(v value) bool {
			if v.k != kInt {
				return false
			}
			var fits bool
			total, fits = checkedAdd(total, v.n)
			return fits
		})
		return intVal(total), ok
	},
	"max": extreme(1),
	"min": extreme(-1),
	"abs": func(_ *machine, a []value) (value, bool) {
		if a[0].k != kInt || a[0].n == math.MinInt64 {
			return undef, false
		}
		return intVal(abs64(a[0].n)), true
	},
	"lower":      strFunc(strings.ToLower),
	"upper":      strFunc(strings.ToUpper),
	"trim_space": strFunc(strings.TrimSpace),
	"object.get": func(m *machine, a []value) (value, bool) {
		obj, key, dflt := a[0], a[1], a[2]
		switch obj.k {
		case kLimit, kSpend, kObj:
		case kConst:
			if c := obj.constV(); c.isArray || c.isSet {
				return undef, false
			}
		default:
			return undef, false // not an object: OPA reports a type error
		}
		if !key.scalar() {
			return undef, false // a path, or a composite key
		}
		if v := m.get(obj, key); v.k != kUndef {
			return v, true
		}
		return dflt, true
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
	// net.cidr_contains(cidr, ip) exactly as OPA decides it when the second
	// operand is an IP address; a CIDR there, or anything that does not
	// parse, goes to the general evaluator.
	"net.cidr_contains": func(_ *machine, a []value) (bool, bool) {
		if a[0].k != kStr || a[1].k != kStr {
			return false, false
		}
		_, n, err := net.ParseCIDR(a[0].s)
		if err != nil {
			return false, false
		}
		ip := net.ParseIP(a[1].s)
		if ip == nil {
			return false, false
		}
		return n.Contains(ip), true
	},
	"endswith": strTest(strings.HasSuffix),
	"contains": strTest(strings.Contains),
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

// extreme is max (sign 1) or min (sign -1) of an array or set of integers,
// or of strings; undefined when it is empty.
func extreme(sign int) builtin {
	return func(m *machine, a []value) (value, bool) {
		best := undef
		ok := m.eachDistinct(a[0], func(v value) bool {
			if v.k != kInt && v.k != kStr {
				return false
			}
			if best.k == kUndef {
				best = v
				return true
			}
			c, ok := compare(v, best)
			if ok && c*sign > 0 {
				best = v
			}
			return ok
		})
		return best, ok
	}
}

// eachDistinct calls f on every element of an array, and on every distinct
// member of a set, of scalars; it reports false when coll is not such a
// collection or f returns false.
func (m *machine) eachDistinct(coll value, f func(value) bool) bool {
	var es []value
	set := false
	switch coll.k {
	case kArr:
		es = *coll.x.(*[]value)
	case kSet:
		es, set = *coll.x.(*[]value), true
	case kConst:
		c := coll.constV()
		if !c.isArray && !c.isSet {
			return false
		}
		es = c.elems
	default:
		return false
	}
next:
	for i, e := range es {
		if !e.scalar() {
			return false
		}
		if set {
			for _, prev := range es[:i] {
				if prev == e {
					continue next
				}
			}
		}
		if !f(e) {
			return false
		}
	}
	return true
}

func strFunc(f func(string) string) builtin {
	return func(_ *machine, a []value) (value, bool) {
		if a[0].k != kStr {
			return undef, false
		}
		return strVal(f(a[0].s)), true
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
