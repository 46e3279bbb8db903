package proxy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// apiBodySeeds are reserve, settle and release bodies, well and badly
// formed, for FuzzReadAPIBody and TestReadAPIBodyAsUnmarshal.
var apiBodySeeds = []string{
	`{"cost":{"tokens":100},"model":"gpt-4o-mini"}`,
	`{"cost":{"requests":0,"usd":"0.5","units":3},"route":"/search","ttl":"5m","upstream":"u","attributes":{"job":"nightly"}}`,
	`{"cost":{"requests":null,"tokens":null},"kind":null,"body":null}`,
	`{"kind":"chat_completions","body":{"model":"m","messages":[{"role":"user","content":"hi \u00e9"}]}}`,
	`{"reservation_id":"rsv_abc.def","usage":{"input_tokens":80,"output_tokens":10}}`,
	`{"reservation_id":"r","kind":"chat_completions","response":{"usage":{"prompt_tokens":1}},"status":"failed","model":"x"}`,
	`{"reservation_id":"r","usage":null,"response":[1,2,{"a":[]}]}`,
	`{"reservation_id":"r\u0041\n","model":"caf\u00e9","kind":"\ud800"}`,
	"{\"model\":\"caf\xc3\xa9\",\"route\":\"bad \xff utf-8\"}",
	`{"co\u0073t":{"t\u006fkens":5}}`,
	`{"cost":{"tokens":1.0}}`, `{"cost":{"tokens":1e2}}`, `{"cost":{"tokens":-0}}`,
	`{"cost":{"tokens":9223372036854775807}}`, `{"cost":{"tokens":9223372036854775808}}`,
	`{"cost":{"tokens":-9223372036854775808}}`, `{"cost":{"tokens":"5"}}`, `{"cost":{"tokens":true}}`,
	`{"cost":5}`, `{"cost":[]}`, `{"cost":"x"}`, `{"model":5}`, `{"model":{}}`, `{"attributes":[]}`,
	`{"attributes":{"a":null,"b":"x"}}`, `{"attributes":{"a":1}}`,
	`null`, ` null `, `[]`, `"s"`, `5`, `true`, ``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`,
	`{"a":1}{"b":2}`, `{"a":1} x`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":tru}`,
	`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":"unterminated}`, `{"a":[1,2,]}`, `{"a":[,]}`,
	`{"reservation_id":"r","reservation_id":"s"}`, `{"Reservation_ID":"r"}`, `{"cost":{"tokens":1,"bogus":2}}`,
	`  {"model" : "m" , "cost" : { "tokens" : 3 } }  `,
}

// decodeStd is decodeStrict's answer by encoding/json: json.Unmarshal,
// then checkKeys.
func decodeStd(raw []byte, v apiBody) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return err
	}
	return checkKeys(raw, fieldsOf(reflect.TypeOf(v)))
}

// checkAsUnmarshal fails t when decodeStrict and encoding/json disagree on
// raw: on whether it is refused, or on what it decodes to.
func checkAsUnmarshal(t *testing.T, raw []byte) {
	t.Helper()
	for _, mk := range []func() apiBody{
		func() apiBody { return new(reserveRequest) },
		func() apiBody { return new(settleRequest) },
		func() apiBody { return new(releaseRequest) },
	} {
		fast, std := mk(), mk()
		errFast, errStd := decodeStrict(raw, fast), decodeStd(raw, std)
		if (errFast == nil) != (errStd == nil) {
			t.Fatalf("%T %q: readAPIBody %v, encoding/json %v", fast, raw, errFast, errStd)
		}
		if errFast == nil && !reflect.DeepEqual(fast, std) {
			t.Fatalf("%T %q: readAPIBody %+v, encoding/json %+v", fast, raw, fast, std)
		}
	}
}

// TestReadAPIBodyAsUnmarshal: on the seeds and on bodies nested past
// encoding/json's depth bound, decodeStrict answers as json.Unmarshal
// with checkKeys does.
func TestReadAPIBodyAsUnmarshal(t *testing.T) {
	for _, s := range apiBodySeeds {
		checkAsUnmarshal(t, []byte(s))
	}
	for _, depth := range []int{maxJSONDepth - 1, maxJSONDepth, maxJSONDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := map[string]string{"[": "]", `{"a":`: "}"}[open]
			deep := `{"body":` + strings.Repeat(open, depth-1) + "1" + strings.Repeat(close, depth-1) + `}`
			checkAsUnmarshal(t, []byte(deep))
		}
	}
}

// FuzzReadAPIBody: on any bytes, decodeStrict refuses what json.Unmarshal
// with checkKeys refuses, and decodes the rest to the same values.
func FuzzReadAPIBody(f *testing.F) {
	for _, s := range apiBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkAsUnmarshal(t, raw)
	})
}

// BenchmarkDecodeStrict: a settle body read by readAPIBody and by
// json.Unmarshal, each followed by checkKeys.
func BenchmarkDecodeStrict(b *testing.B) {
	raw := []byte(`{"reservation_id":"rsv_` + strings.Repeat("eyJpIjoicmVxXzAxYTIzOWYw", 22) + `.AbCdEfGhIjKlMnOpQrStUv","usage":{"input_tokens":80,"output_tokens":10}}`)
	for name, decode := range map[string]func([]byte, apiBody) error{"readAPIBody": decodeStrict, "unmarshal": decodeStd} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var in settleRequest
				if err := decode(raw, &in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
