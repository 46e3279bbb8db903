package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
)

func FuzzDecodeInput(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		b, _ := json.Marshal(randomInput(r))
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"caller":{"plan":"free"},"limits":null}`))
	f.Add([]byte(`{"spend":[{"scope":"team","period":"day"}]}`))
	f.Add([]byte(`{"time":{"hour":24}}`))
	f.Add([]byte(`{"estimate":{"cost_nano_usd":1e3}}`))
	f.Add([]byte(`{"request":{"page":99999999999999999999}}`))
	f.Add([]byte(`{} {}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodeInput(data)
		if err != nil {
			return
		}
		// What decodes is valid, and survives a round trip unchanged.
		if err := in.Validate(); err != nil {
			t.Fatalf("decoded input is invalid: %v", err)
		}
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeInput(b)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", b, err)
		}
		if !reflect.DeepEqual(normalize(in), normalize(again)) {
			t.Fatalf("round trip changed the input:\n%+v\n%+v", in, again)
		}
		_ = in.Value()
	})
}

// normalize makes nil and empty lists equal.
func normalize(in *Input) *Input {
	c := *in
	if len(c.Limits) == 0 {
		c.Limits = nil
	}
	if len(c.Spend) == 0 {
		c.Spend = nil
	}
	return &c
}

func FuzzDecodeVerdict(f *testing.F) {
	for _, s := range []string{
		`{"outcome":"allow"}`,
		`{"outcome":"hard","status":402,"reason":"budget"}`,
		`{"outcome":"soft","friction":{"delay_ms":10,"cap_max_tokens":256,"downgrade_model":"m","warning":"w"}}`,
		`{"outcome":"hard","status":429.0}`,
		`{"outcome":"soft","friction":{"delay_ms":1e30}}`,
		`{"outcome":"soft","friction":null}`,
		`[]`, `null`, `"hard"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			return
		}
		got, err := decodeVerdict(v)
		if err != nil {
			return
		}
		// A decoded verdict obeys the documented shape.
		switch got.outcome {
		case Hard:
			if hardStatusRank[got.status] == 0 || !got.friction.IsZero() {
				t.Fatalf("bad hard verdict %+v from %s", got, s)
			}
		case Soft:
			if got.status != 0 || got.friction.DelayMS < 0 || got.friction.CapMaxTokens < 0 {
				t.Fatalf("bad soft verdict %+v from %s", got, s)
			}
		case Allow:
			if got.status != 0 || !got.friction.IsZero() {
				t.Fatalf("bad allow verdict %+v from %s", got, s)
			}
		default:
			t.Fatalf("bad outcome %q from %s", got.outcome, s)
		}
	})
}

var (
	fuzzSetOnce sync.Once
	fuzzSet     *Set
	fuzzSetErr  error
)

// allPolicies loads the example, quickstart and construct policies as one
// set.
func allPolicies() (*Set, error) {
	fuzzSetOnce.Do(func() {
		fsys := fstest.MapFS{}
		for _, dir := range []string{"../examples/policies", "../examples/quickstart/policies", "testdata/constructs"} {
			for name, f := range dirFS(dir) {
				if !strings.HasSuffix(name, "_test.rego") {
					fsys[strings.ReplaceAll(dir, "/", "_")+"/"+name] = f
				}
			}
		}
		fuzzSet, fuzzSetErr = Load(fsys)
	})
	return fuzzSet, fuzzSetErr
}

// FuzzFastPathEqualsRego decides fuzzed inputs with the fast path and with
// the general evaluator alone, over every policy the tests know.
func FuzzFastPathEqualsRego(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 16 {
		b, _ := json.Marshal(randomInput(r))
		f.Add(b)
	}
	s, err := allPolicies()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := DecodeInput(data)
		if err != nil {
			return
		}
		got, err1 := s.Decide(context.Background(), in)
		want, err2 := s.DecideRego(context.Background(), in)
		if fastPanics.Load() != 0 {
			t.Fatalf("the fast path panicked on %s", data)
		}
		if fmt.Sprint(err1) != fmt.Sprint(err2) || !reflect.DeepEqual(got, want) {
			t.Fatalf("input %s:\nfast %+v %v\nrego %+v %v", data, got, err1, want, err2)
		}
	})
}
