package proxy

// checkKeys walks a reserve, settle or release body's member names in one
// pass over its bytes, without allocating for a body of the API's usual
// shape. The body has been read by readAPIBody already, so it is one
// valid JSON value; a member name written with an escape (\u0061) or
// beyond ASCII sends the body to checkKeysSlow, which decodes the names as
// encoding/json does.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// checkKeys tells what is wrong with the member names of a reserve,
// settle or release body that encoding/json would read anyway: a member
// given twice (it keeps the last) or spelled in another case ("COST",
// "Usd", or a Unicode letter that folds to an ASCII one: it matches names
// without regard to case). A body that a case-sensitive reader (a log, a
// gateway, the caller's own tooling) would read otherwise is refused, as
// the proxy refuses priced fields spelled twice. The API's names are
// lower-case ASCII; the LLM body or response to estimate ("body",
// "response") is the estimator's to check, and attribute names are
// checked by checkAttributes. A name that known, the body's type's
// fields, does not list is refused too, as encoding/json's
// DisallowUnknownFields would. raw must be valid JSON.
func checkKeys(raw []byte, known jsonFields) error {
	s := keyScan{b: raw}
	err := s.value(0, false, true, known)
	if s.escaped {
		return checkKeysSlow(raw, known)
	}
	return err
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

// keyScan reads a valid JSON value from b at i.
type keyScan struct {
	b []byte
	i int
	// escaped is set when a member name checked holds an escape or a
	// byte beyond ASCII: the scan stops, and checkKeysSlow decides.
	escaped bool
}

// smallObject is how many member names an object's duplicate check keeps
// in an array before it takes a map.
const smallObject = 16

// value reads the value at s.i; depth is 0 for the body itself, attrs
// tells that it is the attributes object, check whether its names are
// checked at all (not inside "body" or "response"), known the names an
// object there may have (nil: any).
func (s *keyScan) value(depth int, attrs, check bool, known jsonFields) error {
	s.space()
	switch s.b[s.i] {
	case '{':
		s.i++
		var (
			small [smallObject][]byte
			n     int
			big   map[string]bool
		)
		for {
			s.space()
			if s.b[s.i] == '}' {
				s.i++
				return nil
			}
			if s.b[s.i] == ',' {
				s.i++
				s.space()
			}
			start, end, esc := s.str()
			k := s.b[start:end]
			if check {
				if esc {
					s.escaped = true
					return nil
				}
				dup := false
				if big != nil {
					dup = big[string(k)]
				} else {
					for _, o := range small[:n] {
						if bytes.Equal(o, k) {
							dup = true
							break
						}
					}
				}
				switch {
				case dup:
					return fmt.Errorf("field %q appears twice", k)
				case !attrs && !lowerName(k):
					return fmt.Errorf("field %q: fields are spelled in lower case, exactly as documented", k)
				}
				if _, ok := known[string(k)]; known != nil && !ok {
					return fmt.Errorf("json: unknown field %q", k)
				}
				switch {
				case big != nil:
					big[string(k)] = true
				case n < smallObject:
					small[n] = k
					n++
				default:
					big = make(map[string]bool, 2*smallObject)
					for _, o := range small {
						big[string(o)] = true
					}
					big[string(k)] = true
				}
			}
			s.space()
			s.i++ // ':'
			top := check && depth == 0
			inner := check && !(top && (string(k) == "body" || string(k) == "response"))
			if err := s.value(depth+1, top && string(k) == "attributes", inner, known[string(k)]); err != nil || s.escaped {
				return err
			}
		}
	case '[':
		s.i++
		for {
			s.space()
			switch s.b[s.i] {
			case ']':
				s.i++
				return nil
			case ',':
				s.i++
			}
			if err := s.value(depth+1, false, check, known); err != nil || s.escaped {
				return err
			}
		}
	case '"':
		s.str()
	default: // a number, true, false or null
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', ']', '}', ' ', '\t', '\n', '\r':
				return nil
			}
			s.i++
		}
	}
	return nil
}

// str reads the string at s.i and returns the bounds of its text, and
// whether the text holds an escape or a byte beyond ASCII.
func (s *keyScan) str() (start, end int, esc bool) {
	s.i++ // '"'
	start = s.i
	for {
		switch s.b[s.i] {
		case '"':
			end = s.i
			s.i++
			return start, end, esc
		case '\\':
			esc = true
			s.i += 2 // the escape's second byte is never '"' to stop at
		default:
			// Beyond ASCII, encoding/json's reading may differ from the
			// bytes (an invalid sequence becomes U+FFFD).
			esc = esc || s.b[s.i] >= 0x80
			s.i++
		}
	}
}

func (s *keyScan) space() { s.i = skipSpace(s.b, s.i) }

// lowerName tells whether s is spelled as the API's names are: a-z, 0-9
// and _.
func lowerName(s []byte) bool {
	for _, c := range s {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return len(s) > 0
}

// checkKeysSlow is checkKeys with every name decoded by encoding/json,
// for a body that spells one with an escape.
func checkKeysSlow(raw []byte, known jsonFields) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return walkKeys(dec, 0, false, known)
}

// walkKeys reads the JSON value at dec's position, checking the member
// names of its objects as checkKeys does; depth is 0 for the body itself,
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
