package costmodel

// Search query complexity.
//
// A search API's cost grows with what a query asks of the index: more terms
// and boolean operators mean more posting lists to merge; a wildcard or a
// regular expression expands into many terms; filters add clauses; a large
// page, or a page deep into the results, makes the engine collect and sort
// more hits. Complexity turns these into an integer score:
//
//	score = base
//	      + terms × term + operators × operator
//	      + wildcards × wildcard + regexes × regex + filters × filter
//	      + ceil(page_size / page_unit) × page
//	      + ceil(max(offset − deep_from, 0) / deep_unit) × deep
//
// A query string is read the way Lucene-style engines read one: whitespace
// separates terms; "a quoted phrase" is one term plus one operator; AND, OR,
// NOT, &&, ||, a leading + or -, and each parenthesised group are operators;
// a term with * or ? (or a fuzzy ~) is a wildcard; /a regex/ is a regex; a
// field:value term is a filter. A JSON query object (an Elasticsearch-style
// DSL) is walked instead: bool, must, should, must_not, and, or and not keys
// are operators; wildcard, prefix and fuzzy keys wildcards; regexp keys
// regexes; term, terms, range, exists, filter and geo_* keys filters; and
// every other string leaf a term.

import (
	"fmt"
	"strings"

	"github.com/costgate/costgate/internal/jsonscan"
)

// Complexity scores a search query; see the top of this file. Zero weights
// take the defaults given on each field.
type Complexity struct {
	Query    Source `yaml:"query" json:"query"`         // where the query is: a string, or a JSON query object
	PageSize Source `yaml:"page_size" json:"page_size"` // results per page
	Offset   Source `yaml:"offset" json:"offset"`       // results skipped
	Page     Source `yaml:"page" json:"page"`           // 1-based page number; with an offset, the deeper counts
	// Filters counts extra filters: a JSON field (an array or object counts
	// its elements) or a query parameter; QueryPrefix also counts every query
	// parameter whose name starts with it ("filter." counts filter.lang=go).
	Filters     Source  `yaml:"filters" json:"filters"`
	QueryPrefix string  `yaml:"filter_prefix" json:"filter_prefix,omitempty"`
	Weights     Weights `yaml:"weights" json:"weights"`
}

// Weights are the score's coefficients. A zero field takes its default.
type Weights struct {
	Base     int64 `yaml:"base" json:"base,omitempty"`           // default 1
	Term     int64 `yaml:"term" json:"term,omitempty"`           // default 1
	Operator int64 `yaml:"operator" json:"operator,omitempty"`   // default 1
	Wildcard int64 `yaml:"wildcard" json:"wildcard,omitempty"`   // default 3
	Regex    int64 `yaml:"regex" json:"regex,omitempty"`         // default 10
	Filter   int64 `yaml:"filter" json:"filter,omitempty"`       // default 2
	PageUnit int64 `yaml:"page_unit" json:"page_unit,omitempty"` // default 10 results
	Page     int64 `yaml:"page" json:"page,omitempty"`           // default 1 per page_unit
	DeepFrom int64 `yaml:"deep_from" json:"deep_from,omitempty"` // default offset 100
	DeepUnit int64 `yaml:"deep_unit" json:"deep_unit,omitempty"` // default 100 results
	Deep     int64 `yaml:"deep" json:"deep,omitempty"`           // default 5 per deep_unit
}

func (w Weights) withDefaults() Weights {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&w.Base, 1)
	def(&w.Term, 1)
	def(&w.Operator, 1)
	def(&w.Wildcard, 3)
	def(&w.Regex, 10)
	def(&w.Filter, 2)
	def(&w.PageUnit, 10)
	def(&w.Page, 1)
	def(&w.DeepFrom, 100)
	def(&w.DeepUnit, 100)
	def(&w.Deep, 5)
	return w
}

func (c *Complexity) validate() error {
	if c.Query.JSON == "" && c.Query.Query == "" && c.Query.Header == "" {
		return fmt.Errorf("costmodel: rule complexity: query: name a json field, query parameter or header")
	}
	w := c.Weights
	for _, v := range []int64{w.Base, w.Term, w.Operator, w.Wildcard, w.Regex, w.Filter, w.PageUnit, w.Page, w.DeepFrom, w.DeepUnit, w.Deep} {
		if v < 0 {
			return fmt.Errorf("costmodel: rule complexity: weights must not be negative")
		}
	}
	for _, s := range []*Source{&c.PageSize, &c.Offset, &c.Page, &c.Filters} {
		if s.Default < 0 || s.Max < 0 {
			return fmt.Errorf("costmodel: rule complexity: default and max must not be negative")
		}
	}
	return nil
}

// ResultPage returns the 1-based page of results req asks for, read as Score
// reads it: the deeper of the offset's page (offset / page size + 1) and
// the page given; 0 when neither is given.
func (c *Complexity) ResultPage(req GenericRequest) (int64, error) {
	doc := newReqBody(req.Body, req.Header)
	size, offset, page, err := c.position(req, &doc)
	switch {
	case err != nil:
		return 0, err
	case offset > 0:
		return max(offset/max(size, 1)+1, page), nil
	}
	return max(page, 0), nil
}

// position reads the page size, the offset and the page of req's results.
// An upstream may honour either of an offset and a page given together,
// so the offset is the deeper of the one given and the page's
// (page - 1) × size.
func (c *Complexity) position(req GenericRequest, doc *reqBody) (size, offset, page int64, err error) {
	if size, err = readSource(c.PageSize, "page_size", req, doc); err != nil {
		return 0, 0, 0, err
	}
	if offset, err = readSource(c.Offset, "offset", req, doc); err != nil {
		return 0, 0, 0, err
	}
	if page, err = readSource(c.Page, "page", req, doc); err != nil {
		return 0, 0, 0, err
	}
	if page > 1 {
		offset = max(offset, mulSat(page-1, max(size, 1)))
	}
	return size, offset, page, nil
}

// readSource reads s from req (its default when it names no place).
func readSource(s Source, what string, req GenericRequest, doc *reqBody) (int64, error) {
	if s.JSON == "" && s.Query == "" && s.Header == "" {
		return s.Default, nil
	}
	v, err := s.read(doc, req.Query, req.Header)
	if err != nil {
		return 0, badRequest(Generic, err, "%s", what)
	}
	return v, nil
}

// QueryStats are the parts of a query that Complexity weighs.
type QueryStats struct {
	Terms, Operators, Wildcards, Regexes, Filters int64
}

// Score returns the complexity score of req's query, at least 1.
func (c *Complexity) Score(req GenericRequest) (int64, error) {
	doc := newReqBody(req.Body, req.Header)
	return c.score(req, &doc)
}

// score is Score with req.Body read through doc, which the caller may
// already have decoded.
func (c *Complexity) score(req GenericRequest, doc *reqBody) (int64, error) {
	w := c.Weights.withDefaults()
	// Of the places given (see fields.go), an upstream may read any one:
	// the most complex reading counts. A name given twice is refused, for
	// an upstream may read its last value, or join them.
	var st QueryStats
	consider := func(s QueryStats) {
		if w.weigh(s) > w.weigh(st) {
			st = s
		}
	}
	if c.Query.JSON != "" {
		raw, ok, err := doc.json(c.Query.JSON)
		if err != nil {
			return 0, badRequest(Generic, err, "query")
		}
		if ok && raw[0] == '"' {
			q, err := stringRaw(raw)
			if err != nil {
				return 0, badRequest(Generic, err, "query")
			}
			consider(ParseQuery(q))
		} else if ok && raw[0] != 'n' {
			var js QueryStats
			s := jsonscan.Scanner{B: raw}
			if err := walkQueryDSL(&s, nil, &js, 0); err != nil {
				return 0, badRequest(Generic, fmt.Errorf("json field %s: %w", c.Query.JSON, err), "query")
			}
			consider(js)
		}
	}
	err := c.Query.texts(doc, req.Query, req.Header, func(_, _, q string) error {
		consider(ParseQuery(q))
		return nil
	})
	if err != nil {
		return 0, badRequest(Generic, err, "query")
	}
	size, offset, _, err := c.position(req, doc)
	if err != nil {
		return 0, err
	}
	filters, err := readSource(c.Filters, "filters", req, doc)
	if err != nil {
		return 0, err
	}
	if c.QueryPrefix != "" {
		// A filter parameter in a spelling some upstream reads as one
		// counts; so does one in a form body, which upstreams merge with
		// the query.
		for k, vs := range req.Query {
			if _, ok := paramPrefix(k, c.QueryPrefix); ok {
				filters = addSat(filters, int64(len(vs)))
			}
		}
		err := doc.formFields(func(k, _ string) error {
			if _, ok := paramPrefix(k, c.QueryPrefix); ok {
				filters = addSat(filters, 1)
			}
			return nil
		})
		if err != nil {
			return 0, badRequest(Generic, err, "filters")
		}
	}
	st.Filters = addSat(max(st.Filters, 0), filters)

	score := addSat(w.Base, w.weigh(st))
	add := func(n, weight int64) { score = addSat(score, mulSat(n, weight)) }
	add(mulDivCeil(size, 1, w.PageUnit), w.Page)
	if offset > w.DeepFrom {
		add(mulDivCeil(offset-w.DeepFrom, 1, w.DeepUnit), w.Deep)
	}
	return max(score, 1), nil
}

// weigh is what a query's st adds to a score.
func (w Weights) weigh(st QueryStats) int64 {
	var n int64
	add := func(k, weight int64) { n = addSat(n, mulSat(k, weight)) }
	add(st.Terms, w.Term)
	add(st.Operators, w.Operator)
	add(st.Wildcards, w.Wildcard)
	add(st.Regexes, w.Regex)
	add(st.Filters, w.Filter)
	return n
}

// ideographicSpace separates terms in Lucene's query syntax as ' ' does.
const ideographicSpace = "\u3000"

// maxQueryDepth is how deep a JSON query object is walked; a deeper one is
// refused rather than scored in part.
const maxQueryDepth = 256

// ParseQuery reads a Lucene-style query string; see the top of this file.
func ParseQuery(q string) QueryStats {
	var st QueryStats
	i := 0
	for i < len(q) {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ')':
			i++
		case strings.HasPrefix(q[i:], ideographicSpace):
			i += len(ideographicSpace)
		case c == '(':
			st.Operators++
			i++
		case c == '"':
			end := strings.IndexByte(q[i+1:], '"')
			if end < 0 {
				end = len(q) - i - 1
			}
			if strings.TrimSpace(q[i+1:i+1+end]) != "" {
				st.Terms++
				st.Operators++
			}
			i += end + 2
			if i < len(q) && q[i] == '~' { // proximity
				st.Wildcards++
			}
		case c == '/':
			end := strings.IndexByte(q[i+1:], '/')
			if end < 0 {
				end = len(q) - i - 1
			}
			st.Regexes++
			i += end + 2
		default:
			j := i
			for j < len(q) && !strings.ContainsRune(" \t\n\r()\"", rune(q[j])) && !strings.HasPrefix(q[j:], ideographicSpace) {
				if q[j] == '\\' && j+1 < len(q) {
					j++ // an escaped character is part of the term
				}
				j++
			}
			st.addWord(q[i:j])
			i = j
		}
	}
	return st
}

func (st *QueryStats) addWord(w string) {
	switch w {
	case "AND", "OR", "NOT", "&&", "||", "!", "-", "+":
		st.Operators++
		return
	}
	if strings.HasPrefix(w, "+") || strings.HasPrefix(w, "-") || strings.HasPrefix(w, "!") {
		st.Operators++
		w = w[1:]
	}
	if w == "" {
		return
	}
	if k := strings.IndexByte(w, ':'); k > 0 && k < len(w)-1 {
		st.Filters++
		w = w[k+1:]
		switch {
		case strings.HasPrefix(w, "/"):
			st.Regexes++
		case strings.ContainsAny(w, "*?~"):
			st.Wildcards++
		}
		return
	}
	st.Terms++
	if strings.ContainsAny(w, "*?~") {
		st.Wildcards++
	}
}

// walkQueryDSL adds what the JSON value at s.I, under key, asks of the
// index to st. A key given twice counts each time: an upstream reads one
// of them. A value nested deeper than maxQueryDepth is an error.
func walkQueryDSL(s *jsonscan.Scanner, key []byte, st *QueryStats, depth int) error {
	if depth > maxQueryDepth {
		return fmt.Errorf("nested deeper than %d levels", maxQueryDepth)
	}
	switch string(key) {
	case "bool", "must", "should", "must_not", "and", "or", "not":
		st.Operators++
	case "wildcard", "prefix", "fuzzy", "query_string", "simple_query_string":
		st.Wildcards++
	case "regexp":
		st.Regexes++
	case "term", "terms", "range", "exists", "filter", "geo_distance", "geo_bounding_box", "geo_shape":
		st.Filters++
	}
	switch s.Peek() {
	case '{':
		return s.Object(depth+1, func(ks, ke int, esc bool) error {
			k := s.KeyBytes(ks, ke, esc)
			return walkQueryDSL(s, k, st, depth+1)
		})
	case '[':
		return s.Array(depth+1, func() error {
			return walkQueryDSL(s, nil, st, depth+1)
		})
	case '"':
		st0, en, err := s.Value(depth)
		if err != nil {
			return err
		}
		q, err := stringRaw(s.B[st0:en])
		if err != nil {
			return err
		}
		*st = addStats(*st, ParseQuery(q))
		return nil
	}
	_, _, err := s.Value(depth)
	return err
}

func addStats(a, b QueryStats) QueryStats {
	return QueryStats{a.Terms + b.Terms, a.Operators + b.Operators, a.Wildcards + b.Wildcards, a.Regexes + b.Regexes, a.Filters + b.Filters}
}
