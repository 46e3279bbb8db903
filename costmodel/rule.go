package costmodel

// Pricing generic metered APIs.
//
// A Rule prices one route of an upstream that is not an LLM API: a search
// API, a geocoder, a scraping service. It is declarative, written in the
// costgate config under the route, for example
//
//	cost:
//	  unit: results
//	  per_call: 0.001          # dollars per request
//	  per_unit: 0.0001         # dollars per unit
//	  units:                   # how many units the request asks for
//	    query: num             # ?num=50
//	    json: params.num       # or {"params":{"num":50}}
//	    header: X-Results      # or X-Results: 50
//	    default: 10
//	    max: 100
//
// The units are the first of the JSON field, query parameter and header that
// is present (a JSON array counts its elements), else Default; Max caps
// them. With a Complexity section, the units are multiplied by a search
// query's complexity score (see Complexity). The cost is
// PerCall + units × PerUnit, in integer nano-dollars. After the response,
// Settle reads the units the upstream reports, if the rule says where.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// GenericRequest is what a Rule looks at: the request as the client sent it.
type GenericRequest struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Body   []byte
}

// Rule prices the requests of one generic route. The zero value is invalid
// (it would make the route free); see Validate.
type Rule struct {
	// Unit names what PerUnit buys ("results", "credits"); informational.
	Unit string `yaml:"unit" json:"unit,omitempty"`
	// PerCall is charged once per request.
	PerCall NanoUSD `yaml:"per_call" json:"per_call,omitempty"`
	// PerUnit is charged per unit.
	PerUnit NanoUSD `yaml:"per_unit" json:"per_unit,omitempty"`
	// Units says where the request states how many units it uses. Without it
	// a request uses one unit.
	Units *Source `yaml:"units" json:"units,omitempty"`
	// Complexity, when set, multiplies the units by a search query's
	// complexity score.
	Complexity *Complexity `yaml:"complexity" json:"complexity,omitempty"`
	// Actual says where the response reports the units actually used, for
	// settlement; without it the estimate is final.
	Actual *Source `yaml:"actual" json:"actual,omitempty"`
	// Free must be set for a rule that prices everything at zero.
	Free bool `yaml:"free" json:"free,omitempty"`
}

// Source is where a number is read from: a JSON field of the body (a dotted
// path; numeric parts index arrays, as in "queries.0.size"), a URL query
// parameter, or a header. The first one present wins, in that order.
type Source struct {
	JSON    string `yaml:"json" json:"json,omitempty"`
	Query   string `yaml:"query" json:"query,omitempty"`
	Header  string `yaml:"header" json:"header,omitempty"`
	Default int64  `yaml:"default" json:"default,omitempty"` // when absent
	Max     int64  `yaml:"max" json:"max,omitempty"`         // cap; 0 means none
}

func (s *Source) validate(what string) error {
	if s == nil {
		return nil
	}
	if s.JSON == "" && s.Query == "" && s.Header == "" {
		return fmt.Errorf("costmodel: rule %s: name a json field, query parameter or header", what)
	}
	if s.Default < 0 || s.Max < 0 {
		return fmt.Errorf("costmodel: rule %s: default and max must not be negative", what)
	}
	if s.Max > 0 && s.Default > s.Max {
		return fmt.Errorf("costmodel: rule %s: default %d exceeds max %d", what, s.Default, s.Max)
	}
	return nil
}

// Validate reports a rule that cannot price anything, or that would make a
// route free without saying so.
func (r Rule) Validate() error {
	if r.PerCall < 0 || r.PerUnit < 0 {
		return errors.New("costmodel: rule: per_call and per_unit must not be negative")
	}
	if r.PerCall == 0 && r.PerUnit == 0 && !r.Free {
		return errors.New("costmodel: rule: per_call and per_unit are both zero; set free: true if the route is meant to be free")
	}
	if err := r.Units.validate("units"); err != nil {
		return err
	}
	if err := r.Actual.validate("actual"); err != nil {
		return err
	}
	if r.Complexity != nil {
		if err := r.Complexity.validate(); err != nil {
			return err
		}
		if r.Actual != nil {
			// Settle would replace the query's complexity points with the
			// count the upstream reports (results, say), which the client
			// chooses.
			return errors.New("costmodel: rule: actual with complexity: the units the upstream reports would replace the query's complexity score; drop actual")
		}
	}
	return nil
}

// Price returns the rule's prices as a Price.
func (r Rule) Price() Price { return Price{PerCall: r.PerCall, PerUnit: r.PerUnit} }

// Unreported is the units to charge a call whose answer's report cannot
// be read (not kept whole, cut, or never come) though the upstream has
// the request: the most the rule's actual lets the answer report
// (Actual.Max), never less than units, the estimate; units when the rule
// reads no answer or bounds it by nothing.
func (r Rule) Unreported(units int64) int64 {
	if r.Actual != nil {
		return max(units, r.Actual.Max)
	}
	return units
}

// Estimate prices one request. A JSON field named by the rule in a body that
// is not JSON, or a number that is not a non-negative integer, gives a
// *BadRequestError; so do units or a cost that cannot be represented (it
// wraps ErrCostOverflow).
func (r Rule) Estimate(req GenericRequest) (Estimate, error) {
	doc := lazyJSON{body: req.Body}
	units := int64(1)
	if r.Units != nil {
		v, err := r.Units.read(&doc, req.Query, req.Header)
		if err != nil {
			return Estimate{Kind: Generic}, badRequest(Generic, err, "units")
		}
		units = v
	}
	if r.Complexity != nil {
		score, err := r.Complexity.score(req, &doc)
		if err != nil {
			return Estimate{Kind: Generic}, err
		}
		units = mulSat(units, score)
	}
	est := Estimate{Kind: Generic, Usage: Usage{Units: units}}
	est.Cost = r.Price().Cost(est.Usage)
	if overflowed(est.Usage, est.Cost) {
		return Estimate{Kind: Generic}, overflowError(Generic)
	}
	return est, nil
}

// Settle reads the units the upstream reports from its response, where
// Actual says. ok is false when the rule has no Actual source or the
// response does not state the units; the estimate then stands.
func (r Rule) Settle(header http.Header, body []byte) (u Usage, ok bool, err error) {
	if r.Actual == nil {
		return Usage{}, false, nil
	}
	doc := lazyJSON{body: body}
	v, found, err := r.Actual.lookup(&doc, nil, header)
	if err != nil && doc.err != nil {
		// An answer that is not JSON (CSV, an image) states no JSON
		// field; its header may still report the units.
		src := *r.Actual
		src.JSON = ""
		v, found, err = src.lookup(&doc, nil, header)
	}
	if err != nil || !found {
		return Usage{}, false, err
	}
	if r.Actual.Max > 0 {
		v = min(v, r.Actual.Max)
	}
	return Usage{Units: v}, true, nil
}

// read returns the source's value, Default when absent, capped by Max.
func (s *Source) read(doc *lazyJSON, q url.Values, h http.Header) (int64, error) {
	v, found, err := s.lookup(doc, q, h)
	if err != nil {
		return 0, err
	}
	if !found {
		v = s.Default
	}
	if s.Max > 0 {
		v = min(v, s.Max)
	}
	return v, nil
}

func (s *Source) lookup(doc *lazyJSON, q url.Values, h http.Header) (v int64, found bool, err error) {
	// Of the places given, an upstream may read any one: the largest
	// reading counts. A parameter or header given twice is refused, for
	// an upstream may read its last value, or join them.
	take := func(n int64) {
		v, found = max(v, n), true
	}
	if s.JSON != "" {
		x, ok, err := doc.get(s.JSON)
		if err != nil {
			return 0, false, err
		}
		if ok && x != nil {
			n, err := countOf(x)
			if err != nil {
				return 0, false, fmt.Errorf("json field %s: %w", s.JSON, err)
			}
			take(n)
		}
	}
	if s.Query != "" && q != nil {
		if vs, ok := q[s.Query]; ok && len(vs) > 0 {
			if len(vs) > 1 {
				return 0, false, fmt.Errorf("query parameter %s: given %d times", s.Query, len(vs))
			}
			n, err := parseCount(vs[0])
			if err != nil {
				return 0, false, fmt.Errorf("query parameter %s: %w", s.Query, err)
			}
			take(n)
		}
	}
	if s.Header != "" && h != nil {
		vs := h.Values(s.Header)
		if len(vs) > 1 {
			return 0, false, fmt.Errorf("header %s: given %d times", s.Header, len(vs))
		}
		if len(vs) == 1 && vs[0] != "" {
			n, err := parseCount(vs[0])
			if err != nil {
				return 0, false, fmt.Errorf("header %s: %w", s.Header, err)
			}
			take(n)
		}
	}
	return v, found, nil
}

// countOf reads a JSON value as a count: a non-negative integer number (or
// a string holding one), or the length of an array or object.
func countOf(v any) (int64, error) {
	switch x := v.(type) {
	case json.Number:
		return parseCount(x.String())
	case string:
		return parseCount(x)
	case []any:
		return int64(len(x)), nil
	case map[string]any:
		return int64(len(x)), nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("want a count, got %T", v)
}

// parseCount reads a non-negative integer; a number with a fraction is
// rounded up (a cost is never rounded down).
func parseCount(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%q is negative", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	if f >= math.MaxInt64 {
		return math.MaxInt64, nil
	}
	return int64(math.Ceil(f)), nil
}

// lazyJSON decodes a body the first time a rule needs a field of it.
type lazyJSON struct {
	body    []byte
	decoded bool
	value   any
	err     error
}

func (d *lazyJSON) get(path string) (any, bool, error) {
	if !d.decoded {
		d.decoded = true
		if len(bytes.TrimSpace(d.body)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(d.body))
			dec.UseNumber()
			if err := dec.Decode(&d.value); err != nil {
				d.err = fmt.Errorf("body is not valid JSON: %w", err)
			} else if dec.More() {
				d.err = errors.New("body is not valid JSON: data after the value")
			}
		}
	}
	if d.err != nil {
		return nil, false, d.err
	}
	v := d.value
	for _, part := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[part]; !ok {
				return nil, false, nil
			}
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false, nil
			}
			v = x[i]
		default:
			return nil, false, nil
		}
	}
	return v, true, nil
}
