package learned

import (
	"fmt"
	"math/bits"
	"net/url"
	"strconv"
	"strings"

	"github.com/costgate/costgate/costmodel"
)

// Shape is what of a request's form predicts its output: its own output
// limit, rounded up to a power of two, whether it offers tools, and
// whether it asks for more than one completion.
type Shape struct {
	// MaxTokens is the request's output limit rounded up to a power of
	// two (1 to 2^31); 0 when the request sets none.
	MaxTokens int64
	Tools     bool
	// Multi is set when the request asks for several completions (n > 1,
	// or several prompts): its output is their sum.
	Multi bool
}

// ShapeOf is the shape of a request whose own output limit is
// maxOutputTokens (0 for none), with tools or not, asking for outputs
// completions.
func ShapeOf(maxOutputTokens int64, tools bool, outputs int64) Shape {
	s := Shape{Tools: tools, Multi: outputs > 1}
	if maxOutputTokens > 0 {
		if maxOutputTokens >= 1<<31 {
			s.MaxTokens = 1 << 31
		} else {
			s.MaxTokens = 1 << bits.Len64(uint64(maxOutputTokens-1))
		}
	}
	return s
}

// Key names one learned estimate. Tenant comes from the configuration,
// Model is the canonical model (the gate gives every model the price table
// does not know one name, so that made-up names add no keys), Route the
// API path.
type Key struct {
	Tenant, Model, Route string
	Shape                Shape
}

// String is the key as `costgate estimate` and logs show it.
func (k Key) String() string {
	return fmt.Sprintf("tenant=%s model=%s route=%s max_tokens<=%d tools=%t multi=%t",
		k.Tenant, k.Model, k.Route, k.Shape.MaxTokens, k.Shape.Tools, k.Shape.Multi)
}

// redisPrefix starts every key of the learned estimates in Redis.
const redisPrefix = "costgate:learned:v1:"

// encode is the key's name in Redis: its fields query-escaped and joined
// by '|', which escaping removes from the fields, so that no two keys
// share a name however their tenants, models and routes are spelled.
func (k Key) encode() string {
	b := func(v bool) string {
		if v {
			return "1"
		}
		return "0"
	}
	return redisPrefix + url.QueryEscape(k.Tenant) + "|" + url.QueryEscape(k.Model) + "|" + url.QueryEscape(k.Route) +
		"|" + strconv.FormatInt(k.Shape.MaxTokens, 10) + "|" + b(k.Shape.Tools) + "|" + b(k.Shape.Multi)
}

// decodeKey parses a name encode made.
func decodeKey(name string) (Key, error) {
	rest, ok := strings.CutPrefix(name, redisPrefix)
	if !ok {
		return Key{}, fmt.Errorf("learned: key %q: not under %s", name, redisPrefix)
	}
	f := strings.Split(rest, "|")
	if len(f) != 6 {
		return Key{}, fmt.Errorf("learned: key %q: want 6 fields, got %d", name, len(f))
	}
	var k Key
	var err error
	for i, dst := range []*string{&k.Tenant, &k.Model, &k.Route} {
		if *dst, err = url.QueryUnescape(f[i]); err != nil {
			return Key{}, fmt.Errorf("learned: key %q: %w", name, err)
		}
	}
	mt, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || (mt != 0 && (mt < 1 || mt > 1<<31 || mt&(mt-1) != 0)) {
		return Key{}, fmt.Errorf("learned: key %q: max_tokens bucket %q is not a power of two up to 2^31", name, f[3])
	}
	k.Shape.MaxTokens = mt
	for i, dst := range []*bool{&k.Shape.Tools, &k.Shape.Multi} {
		switch f[4+i] {
		case "0":
		case "1":
			*dst = true
		default:
			return Key{}, fmt.Errorf("learned: key %q: flag %q is not 0 or 1", name, f[4+i])
		}
	}
	if k.Tenant == "" {
		return Key{}, fmt.Errorf("learned: key %q: empty tenant", name)
	}
	return k, nil
}

// UnknownModel is the one name every model the price table does not know
// is learned under: names a client makes up add no keys.
const UnknownModel = "(unknown)"

// KeyOf is the key the output of est, a request of tenant on route (an
// API path) for canonical, its model's canonical name, is learned under;
// false when its output is not learned (see costmodel.Estimate.Learnable).
func KeyOf(tenant, route, canonical string, est *costmodel.Estimate) (Key, bool) {
	if !est.Learnable() {
		return Key{}, false
	}
	if est.UnknownModel {
		canonical = UnknownModel
	}
	return Key{Tenant: tenant, Model: canonical, Route: route, Shape: ShapeOf(est.MaxOutputTokens, est.Tools, est.Outputs)}, true
}
