package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
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
	`{"cost":{"usd":"0.5","USD":"0"}}`, `{"cost":{},"cost":{}}`, `{"co\u017ft":{}}`,
	`{"reservation_id":"r","usage":{"input_tokens":1},"usage":{}}`,
	`{"attributes":{"job":"a","Job":"b","job":"c"}}`, `{"attributes":{"a":"x","\u0061":"y"}}`,
	`{"body":{"messages":[{"role":"user","role":"x"}],"Model":"m"},"kind":"chat_completions"}`,
	`{"response":{"usage":{"prompt_tokens":1}},"response":{}}`, `{"a":[{"b":1,"b":2}]}`,
	`{"x":"a\"b","y":[1,2.5e3,true,false,null,"\\"]}`,
	`{"attributes":{` + attrs(40) + `}}`, `{"attributes":{` + attrs(40) + `,"k7":"again"}}`,
}

func attrs(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	return strings.Join(parts, ",")
}

// decodeStd is decodeStrict's answer by encoding/json: json.Unmarshal,
// then namesStd with the names of v's type's fields.
func decodeStd(raw []byte, v apiBody) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return err
	}
	return namesStd(raw, fieldsOf(reflect.TypeOf(v)))
}

// jsonFields are the JSON member names of a struct type, each to its
// value's own (a struct's, or a slice's or pointer's struct's), nil for a
// value with no fixed names (a map, a scalar, json.RawMessage).
type jsonFields map[string]jsonFields

// fieldCache holds fieldsOf's answers by type.
var fieldCache sync.Map // reflect.Type -> jsonFields

// fieldsOf returns the JSON member names of t (a struct, or a pointer to
// one) as encoding/json spells them: the tag's name, else the field's; an
// unexported field or one tagged "-" has none. nil for any other type.
func fieldsOf(t reflect.Type) jsonFields {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		if t == rawMessageType {
			return nil
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	if f, ok := fieldCache.Load(t); ok {
		return f.(jsonFields)
	}
	fs := jsonFields{}
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch {
		case !sf.IsExported() || name == "-":
			continue
		case name == "":
			name = sf.Name
		}
		fs[name] = fieldsOf(sf.Type)
	}
	fieldCache.Store(t, fs)
	return fs
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// namesStd checks the member names of raw as readAPIBody does, every name
// read through encoding/json's tokens: each once, the API's in lower case
// and known, attribute names free, an LLM body or response not checked.
func namesStd(raw []byte, known jsonFields) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return walkKeys(dec, 0, false, known)
}

// walkKeys reads the JSON value at dec's position, checking the member
// names of its objects as namesStd says; depth is 0 for the body itself,
// attrs tells that the value is the attributes object, known the names an
// object there may have (nil: any).
func walkKeys(dec *json.Decoder, depth int, attrs bool, known jsonFields) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return err
			}
			k, _ := t.(string)
			switch {
			case seen[k]:
				return fmt.Errorf("field %q appears twice", k)
			case !attrs && !lowerName([]byte(k)):
				return fmt.Errorf("field %q: fields are spelled in lower case, exactly as documented", k)
			}
			if _, ok := known[k]; known != nil && !ok {
				return fmt.Errorf("json: unknown field %q", k)
			}
			seen[k] = true
			if depth == 0 && (k == "body" || k == "response") {
				var skip json.RawMessage // the estimator's to check
				if err := dec.Decode(&skip); err != nil {
					return err
				}
				continue
			}
			if err := walkKeys(dec, depth+1, depth == 0 && k == "attributes", known[k]); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		for dec.More() {
			if err := walkKeys(dec, depth+1, false, known); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
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
// with namesStd does.
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
// with namesStd refuses, and decodes the rest to the same values.
func FuzzReadAPIBody(f *testing.F) {
	for _, s := range apiBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkAsUnmarshal(t, raw)
	})
}

// BenchmarkDecodeStrict: a settle body read by readAPIBody (names
// checked) and by json.Unmarshal alone (names not checked).
func BenchmarkDecodeStrict(b *testing.B) {
	raw := []byte(`{"reservation_id":"rsv_` + strings.Repeat("eyJpIjoicmVxXzAxYTIzOWYw", 22) + `.AbCdEfGhIjKlMnOpQrStUv","usage":{"input_tokens":80,"output_tokens":10}}`)
	unmarshal := func(raw []byte, v apiBody) error { return json.Unmarshal(raw, v) }
	for name, decode := range map[string]func([]byte, apiBody) error{"readAPIBody": decodeStrict, "unmarshal": unmarshal} {
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
