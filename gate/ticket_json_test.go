package gate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// TestTicketJSON: a ticket written by appendJSON reads back as the one
// json.Marshal writes, every field set (a field added to ticket or to
// costmodel.Usage and not written fails here), with strings that need
// escaping, invalid UTF-8 and zero values of omitted fields.
func TestTicketJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		fill func(v reflect.Value, n *int)
	}{
		{"every field", fillAll},
		{"zero values", func(reflect.Value, *int) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tk ticket
			n := 0
			tc.fill(reflect.ValueOf(&tk).Elem(), &n)
			want, err := json.Marshal(tk)
			if err != nil {
				t.Fatal(err)
			}
			var fromStd, fromOurs ticket
			if err := json.Unmarshal(want, &fromStd); err != nil {
				t.Fatal(err)
			}
			got := tk.appendJSON(nil)
			if err := json.Unmarshal(got, &fromOurs); err != nil {
				t.Fatalf("appendJSON wrote %s: %v", got, err)
			}
			if !reflect.DeepEqual(fromStd, fromOurs) {
				t.Fatalf("read back:\n%+v\nwant\n%+v\n(written %s)", fromOurs, fromStd, got)
			}
		})
	}
}

// fillAll sets every field of v, recursively, to a distinct non-zero
// value: strings with a quote, a backslash, a control character, a
// non-ASCII letter and an invalid byte.
func fillAll(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("v%d \"q\" \\ \x01\x1f é \xff<&>", *n))
	case reflect.Int64, reflect.Int:
		v.SetInt(int64(*n) * -1_000_003)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).Tag.Get("json") == "-" {
				continue // not in a ticket (costmodel.Usage.Steps)
			}
			fillAll(v.Field(i), n)
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fillAll(s.Index(i), n)
		}
		v.Set(s)
	default:
		panic("fillAll: a field of kind " + v.Kind().String())
	}
}
