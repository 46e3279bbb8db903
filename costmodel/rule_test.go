package costmodel

import (
	"errors"
	"net/http"
	"net/url"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestRuleYAML(t *testing.T) {
	src := `
unit: results
per_call: 0.001
per_unit: "$0.0001"
units: {query: num, json: params.num, header: X-Results, default: 10, max: 100}
actual: {header: X-Results-Returned}
`
	var r Rule
	if err := yaml.Unmarshal([]byte(src), &r); err != nil {
		t.Fatal(err)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.PerCall != 1_000_000 || r.PerUnit != 100_000 || r.Units.Max != 100 {
		t.Fatalf("parsed %+v %+v", r, r.Units)
	}
	cases := []struct {
		name  string
		req   GenericRequest
		units int64
	}{
		{"default", GenericRequest{}, 10},
		{"query", GenericRequest{Query: url.Values{"num": {"50"}}}, 50},
		{"the largest of json and query", GenericRequest{Query: url.Values{"num": {"50"}}, Body: []byte(`{"params":{"num":7}}`)}, 50},
		{"the largest of query and header", GenericRequest{Query: url.Values{"num": {"5"}}, Header: http.Header{"X-Results": {"20"}}}, 20},
		{"header", GenericRequest{Header: http.Header{"X-Results": {"20"}}}, 20},
		{"capped", GenericRequest{Query: url.Values{"num": {"5000"}}}, 100},
		{"fraction rounds up", GenericRequest{Query: url.Values{"num": {"2.1"}}}, 3},
		{"json array counts", GenericRequest{Body: []byte(`{"params":{"num":[1,2,3]}}`)}, 3},
	}
	for _, c := range cases {
		est, err := r.Estimate(c.req)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if est.Usage.Units != c.units || est.Cost != r.PerCall+NanoUSD(c.units)*r.PerUnit || est.Kind != Generic {
			t.Errorf("%s: units %d cost %d; want units %d", c.name, est.Usage.Units, est.Cost, c.units)
		}
	}
	for _, bad := range []GenericRequest{
		{Query: url.Values{"num": {"-3"}}},
		{Query: url.Values{"num": {"lots"}}},
		{Body: []byte(`{"params":`)},
		{Body: []byte(`{"params":{"num":"x"}}`)},
		{Query: url.Values{"num": {"1", "100"}}},
		{Header: http.Header{"X-Results": {"1", "100"}}},
	} {
		_, err := r.Estimate(bad)
		var br *BadRequestError
		if !errors.As(err, &br) {
			t.Errorf("%+v: error %v, want a *BadRequestError", bad, err)
		}
	}
	u, ok, err := r.Settle(http.Header{"X-Results-Returned": {"42"}}, nil)
	if err != nil || !ok || u.Units != 42 {
		t.Errorf("Settle = %+v %v %v", u, ok, err)
	}
	if _, ok, _ := r.Settle(http.Header{}, nil); ok {
		t.Errorf("Settle without the header reported units")
	}
}

func TestRuleValidate(t *testing.T) {
	for name, r := range map[string]Rule{
		"free without saying so":   {},
		"negative":                 {PerCall: -1},
		"empty source":             {PerUnit: 1, Units: &Source{Default: 1}},
		"default over max":         {PerUnit: 1, Units: &Source{Query: "n", Default: 10, Max: 5}},
		"complexity without query": {PerUnit: 1, Complexity: &Complexity{}},
		"negative weight":          {PerUnit: 1, Complexity: &Complexity{Query: Source{Query: "q"}, Weights: Weights{Regex: -1}}},
	} {
		if err := r.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, r)
		}
	}
	if err := (Rule{Free: true}).Validate(); err != nil {
		t.Errorf("free rule: %v", err)
	}
}

func TestParseQuery(t *testing.T) {
	cases := []struct {
		q    string
		want QueryStats
	}{
		{"golang", QueryStats{Terms: 1}},
		{"golang rust zig", QueryStats{Terms: 3}},
		{"golang AND rust OR NOT zig", QueryStats{Terms: 3, Operators: 3}},
		{`"rate limiter" +redis -memcached`, QueryStats{Terms: 3, Operators: 3}},
		{"conc* te?t fuzzy~2", QueryStats{Terms: 3, Wildcards: 3}},
		{"/ab+c/ title:/x.*/", QueryStats{Regexes: 2, Filters: 1}},
		{"lang:go site:example.com (a || b)", QueryStats{Terms: 2, Operators: 2, Filters: 2}},
		{"", QueryStats{}},
	}
	for _, c := range cases {
		if got := ParseQuery(c.q); got != c.want {
			t.Errorf("ParseQuery(%q) = %+v, want %+v", c.q, got, c.want)
		}
	}
}

func TestComplexityScore(t *testing.T) {
	c := &Complexity{
		Query:       Source{Query: "q", JSON: "query"},
		PageSize:    Source{Query: "num", Default: 10},
		Offset:      Source{Query: "start"},
		Page:        Source{Query: "page"},
		QueryPrefix: "filter.",
	}
	score := func(q url.Values, body string) int64 {
		t.Helper()
		s, err := c.Score(GenericRequest{Query: q, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Defaults: base 1 + terms + ceil(size/10).
	if got := score(url.Values{"q": {"golang"}}, ""); got != 1+1+1 {
		t.Errorf("simple: %d", got)
	}
	simple := score(url.Values{"q": {"golang"}}, "")
	for name, q := range map[string]url.Values{
		"more terms":  {"q": {"golang rust"}},
		"operator":    {"q": {"golang AND rust"}},
		"wildcard":    {"q": {"gol*"}},
		"regex":       {"q": {"/gol.*/"}},
		"big page":    {"q": {"golang"}, "num": {"100"}},
		"deep offset": {"q": {"golang"}, "start": {"1000"}},
		"deep page":   {"q": {"golang"}, "page": {"50"}},
		"filters":     {"q": {"golang"}, "filter.lang": {"go"}},
	} {
		if got := score(q, ""); got <= simple {
			t.Errorf("%s: score %d not above the simple query's %d", name, got, simple)
		}
	}
	// deep offset: 1000 → ceil(900/100)=9 × 5 = 45 more.
	if got := score(url.Values{"q": {"golang"}, "start": {"1000"}}, ""); got != simple+45 {
		t.Errorf("deep offset: %d, want %d", got, simple+45)
	}
	// A JSON DSL query.
	dsl := `{"query":{"bool":{"must":[{"match":{"title":"rate limiter"}},{"regexp":{"path":"src/.*"}}],"filter":[{"term":{"lang":"go"}}]}}}`
	if got := score(nil, dsl); got <= simple {
		t.Errorf("DSL: %d", got)
	}
}

func TestConfigYAML(t *testing.T) {
	src := `
prices:
  my-finetune: {input: 0.30, cached_input: 0.15, output: 1.20, max_output_tokens: 16384}
encodings: {my-finetune: cl100k_base}
default_price: {input: 2.50, output: "$10"}
output_reserve: 50
cache_entries: 1024
`
	var c Config
	if err := yaml.Unmarshal([]byte(src), &c); err != nil {
		t.Fatal(err)
	}
	e, err := NewEstimator(c)
	if err != nil {
		t.Fatal(err)
	}
	p, known := e.Price("my-finetune")
	if !known || p.Input != 300_000_000 || p.CachedInput != 150_000_000 || p.Output != 1_200_000_000 || p.MaxOutputTokens != 16384 || e.Encoding("my-finetune") != EncodingCl100k {
		t.Errorf("my-finetune: %+v %v %s", p, known, e.Encoding("my-finetune"))
	}
	if d, known := e.Price("mystery"); known || d.Input != 2_500_000_000 || d.Output != 10*Dollar {
		t.Errorf("default: %+v", d)
	}
	if c.OutputReserve != 50 || c.CacheEntries != 1024 {
		t.Errorf("config %+v", c)
	}
}

// TestRuleUnreported: a call whose report cannot be read is charged the
// most the rule's actual lets the answer report, never less than the
// estimate; without an actual, or one without a max, the estimate.
func TestRuleUnreported(t *testing.T) {
	for _, c := range []struct {
		actual      *Source
		units, want int64
	}{
		{nil, 3, 3},
		{&Source{JSON: "n"}, 3, 3},
		{&Source{JSON: "n", Max: 100}, 3, 100},
		{&Source{JSON: "n", Max: 100}, 150, 150},
	} {
		if got := (Rule{Actual: c.actual}).Unreported(c.units); got != c.want {
			t.Errorf("actual %+v, estimate %d: %d, want %d", c.actual, c.units, got, c.want)
		}
	}
}
