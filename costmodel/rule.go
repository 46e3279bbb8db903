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
// The units are the largest of the JSON field, query parameter, form field
// and header that the request gives (a JSON array counts its elements),
// else Default; Max caps them. Each is read in every spelling some
// upstream reads, and a request that gives one twice is refused (see
// fields.go). With a Complexity section, the units are multiplied by a search
// query's complexity score (see Complexity). The cost is
// PerCall + units × PerUnit, in integer nano-dollars. After the response,
// Settle reads the units the upstream reports, if the rule says where.

import (
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
// parameter, or a header; a form body's field named as the JSON field or
// the query parameter. The largest of those the request gives counts.
type Source struct {
	JSON    string `yaml:"json" json:"json,omitempty"`
	Query   string `yaml:"query" json:"query,omitempty"`
	Header  string `yaml:"header" json:"header,omitempty"`
	Default int64  `yaml:"default" json:"default,omitempty"` // when absent
	Max     int64  `yaml:"max" json:"max,omitempty"`         // cap; 0 means none
	// List says that the json field is a list whose elements are
	// counted (geocoding's addresses). Without it, the field is a count,
	// and an array there is also read as a JavaScript server reads it as
	// a number ([1000] is 1000 to parseInt): the larger reading counts.
	List bool `yaml:"list" json:"list,omitempty"`
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
	if s.List && s.JSON == "" {
		return fmt.Errorf("costmodel: rule %s: list tells how a json field is counted; name one", what)
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

// Charge is the units a successful answer is charged: those it reports
// where Actual says (reported), else Unreported(estimated): a report that
// cannot be read (err tells why), that may be in an answer not kept whole
// (body nil), or that the answer does not state, which a client can often
// have an upstream leave out (?format=csv, ?fields=). The proxy and the
// client's Transport charge by it alike.
func (r Rule) Charge(header http.Header, body []byte, estimated int64) (units int64, reported bool, err error) {
	u, ok, err := r.Settle(header, body)
	if err == nil && ok {
		return u.Units, true, nil
	}
	return r.Unreported(estimated), false, err
}

// Estimate prices one request. A JSON field named by the rule in a body that
// is not JSON, or a number that is not a non-negative integer, gives a
// *BadRequestError; so do units or a cost that cannot be represented (it
// wraps ErrCostOverflow).
func (r Rule) Estimate(req GenericRequest) (Estimate, error) {
	doc := newReqBody(req.Body, req.Header)
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
// response does not state the units (see Charge, which charges both).
func (r Rule) Settle(header http.Header, body []byte) (u Usage, ok bool, err error) {
	if r.Actual == nil {
		return Usage{}, false, nil
	}
	doc := reqBody{b: body} // an answer's body is read as JSON only
	v, found, err := r.Actual.lookup(&doc, nil, header)
	if err != nil && doc.notJSON {
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
func (s *Source) read(d *reqBody, q url.Values, h http.Header) (int64, error) {
	v, found, err := s.lookup(d, q, h)
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

// lookup reads the source in every place the request gives it (see
// fields.go): of these, an upstream may read any one, so the largest
// reading counts. A name given twice is refused, for an upstream may read
// its last value, or join them.
func (s *Source) lookup(d *reqBody, q url.Values, h http.Header) (v int64, found bool, err error) {
	if s.JSON != "" {
		raw, ok, err := d.json(s.JSON)
		if err != nil {
			return 0, false, err
		}
		if ok {
			n, ok, err := countRaw(raw, s.List)
			if err != nil {
				return 0, false, fmt.Errorf("json field %s: %w", s.JSON, err)
			}
			if ok {
				v, found = n, true
			}
		}
	}
	err = s.texts(d, q, h, func(place, name, text string) error {
		n, err := parseCount(text)
		if err != nil {
			return fmt.Errorf("%s %s: %w", place, name, err)
		}
		v, found = max(v, n), true
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return v, found, nil
}

// texts calls fn with the source's value in each place but the JSON body
// that gives it: the query parameter, the form fields named as the query
// parameter or the JSON field, the header. A place that gives it twice
// (in one spelling or two) is an error.
func (s *Source) texts(d *reqBody, q url.Values, h http.Header, fn func(place, name, text string) error) error {
	twice := func(place, name string, n int) error {
		return fmt.Errorf("%s %s: given %d times", place, name, n)
	}
	if s.Query != "" {
		if v, n := namedValue(q, s.Query, ParamIs); n > 1 {
			return twice("query parameter", s.Query, n)
		} else if n == 1 {
			if err := fn("query parameter", s.Query, v); err != nil {
				return err
			}
		}
	}
	if d.form != formNone || d.typeErr != nil {
		for i, name := range [2]string{s.Query, s.JSON} {
			if name == "" || i == 1 && name == s.Query {
				continue
			}
			v, n, err := d.formValue(name)
			switch {
			case err != nil:
				return err
			case n > 1:
				return twice("form field", name, n)
			case n == 1:
				if err := fn("form field", name, v); err != nil {
					return err
				}
			}
		}
	}
	if s.Header != "" {
		if v, n := namedValue(h, s.Header, HeaderIs); n > 1 {
			return twice("header", s.Header, n)
		} else if n == 1 && v != "" {
			if err := fn("header", s.Header, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// parseCount reads a non-negative integer; a number with a fraction is
// rounded up (a cost is never rounded down).
func parseCount(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%q is negative", strings.Clone(s))
		}
		return n, nil
	}
	// The errors hold a copy of s, so that a caller's s need not be on
	// the heap.
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a number", strings.Clone(s))
	}
	if f < 0 {
		return 0, fmt.Errorf("%q is negative", strings.Clone(s))
	}
	if f >= math.MaxInt64 {
		return math.MaxInt64, nil
	}
	return int64(math.Ceil(f)), nil
}
