package proxy

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// FuzzCheckKeys: on any valid JSON, checkKeys's one pass over the bytes
// answers as checkKeysSlow, which reads every name through encoding/json.
func FuzzCheckKeys(f *testing.F) {
	for _, s := range []string{
		`{"cost":{"tokens":100},"model":"gpt-4o-mini"}`,
		`{"cost":{"usd":"0.5","USD":"0"}}`,
		`{"cost":{},"cost":{}}`,
		`{"co\u017ft":{}}`,
		`{"reservation_id":"r","usage":{"input_tokens":1},"usage":{}}`,
		`{"attributes":{"job":"a","Job":"b","job":"c"}}`,
		`{"attributes":{"a":"x","\u0061":"y"}}`,
		`{"body":{"messages":[{"role":"user","role":"x"}],"Model":"m"},"kind":"chat_completions"}`,
		`{"response":{"usage":{"prompt_tokens":1}},"response":{}}`,
		`{"a":[{"b":1,"b":2}]}`,
		`{"x":"a\"b","y":[1,2.5e3,true,false,null,"\\"]}`,
		`null`, `[]`, `"s"`, ` { "cost" : { "tokens" : 1 } } `,
		`{"attributes":{` + attrs(40) + `}}`,
		`{"attributes":{` + attrs(40) + `,"k7":"again"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return
		}
		for _, known := range []jsonFields{nil, fieldsOf(reflect.TypeFor[reserveRequest]()), fieldsOf(reflect.TypeFor[settleRequest]())} {
			fast, slow := checkKeys(raw, known), checkKeysSlow(raw, known)
			if fmt.Sprint(fast) != fmt.Sprint(slow) {
				t.Fatalf("%s: checkKeys %v, checkKeysSlow %v", raw, fast, slow)
			}
		}
	})
}

func attrs(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(parts, ",")
}

// BenchmarkCheckKeys: a reserve body's names checked, against the same
// check through encoding/json's tokens.
func BenchmarkCheckKeys(b *testing.B) {
	raw := []byte(`{"cost":{"tokens":100},"model":"gpt-4o-mini","attributes":{"job":"nightly"}}`)
	known := fieldsOf(reflect.TypeFor[reserveRequest]())
	for name, check := range map[string]func([]byte, jsonFields) error{"scan": checkKeys, "tokens": checkKeysSlow} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := check(raw, known); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
