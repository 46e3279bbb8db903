package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzScanner checks that the scanner accepts exactly what encoding/json
// accepts, at encoding/json's bound on nesting.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `""`, `0`, `-0.5e+10`, `{"a":[1,2,{"b":null}],"c":"\u00e9\n"}`, `{"a":1,}`, `[1 2]`,
		`"\ud800"`, "\"\x01\"", `01`, `1.`, `.5`, `{"a" 1}`, `tru`, `nul`, `"abc`, "\"\xff\xfe\"", `{"a":"b"} x`,
		`"12345678\"9012345678"`, `"1234567\\\\890"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := Scanner{B: b, MaxDepth: 10000} // encoding/json's bound
		_, _, err := s.Value(0)
		if err == nil {
			err = s.End()
		}
		if ok := json.Valid(b); ok != (err == nil) {
			t.Fatalf("json.Valid = %v, scanner error %v, for %q", ok, err, b)
		}
	})
}

// TestMaxDepth checks the bound on nesting: DefaultMaxDepth for a zero
// MaxDepth, MaxDepth otherwise, objects and arrays alike.
func TestMaxDepth(t *testing.T) {
	for _, tc := range []struct {
		name       string
		max, depth int
		ok         bool
	}{
		{"default, at the bound", 0, DefaultMaxDepth, true},
		{"default, beyond", 0, DefaultMaxDepth + 1, false},
		{"encoding/json's, at the bound", 10000, 10000, true},
		{"encoding/json's, beyond", 10000, 10001, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, open := range []string{"[", `{"a":`} {
				close := map[string]string{"[": "]", `{"a":`: "}"}[open]
				b := []byte(strings.Repeat(open, tc.depth) + "1" + strings.Repeat(close, tc.depth))
				s := Scanner{B: b, MaxDepth: tc.max}
				_, _, err := s.Value(0)
				if err == nil {
					err = s.End()
				}
				if (err == nil) != tc.ok {
					t.Errorf("%s nested %d deep, MaxDepth %d: error %v, want ok %v", open, tc.depth, tc.max, err, tc.ok)
				}
			}
		})
	}
}

// FuzzAppendString holds AppendString to json.Marshal, byte for byte.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `a"b\c`, "<&>", "\x00\x1f\b\f\n\r\t", "\xff\xfe", "\u2028\u2029", "é", "\x7f",
		"01234567<", "0123456789abcdef\"", "rsv_eyJpIjoiMDFKWl.AAAA\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("AppendString(%q) = %s, want %s", s, got[1:], want)
		}
	})
}

// BenchmarkAppendString appends a reservation id as the reserve API's
// answers carry it: 600 bytes of base64url.
func BenchmarkAppendString(b *testing.B) {
	s := "rsv_" + strings.Repeat("eyJpIjoiMDFKWl", 42) + ".AAAAAAAAAAAAAAAAAAAAAA"
	buf := make([]byte, 0, 1024)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		buf = AppendString(buf[:0], s)
	}
}
