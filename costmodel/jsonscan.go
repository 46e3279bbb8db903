package costmodel

// A small, strict JSON scanner for the hot path.
//
// Estimating a chat request must read a body of tens of kilobytes on every
// request, and encoding/json spends most of its time validating and
// skipping it (once in checkValid, once more while decoding). The scanner
// below makes one validating pass and hands back the byte spans of the
// fields costmodel needs, so that a message whose count is cached is never
// decoded at all. It accepts exactly RFC 8259 JSON (what encoding/json
// accepts): a body it rejects, encoding/json rejects too, and the fuzz test
// checks that they agree. Invalid UTF-8 inside strings is accepted, as
// encoding/json accepts it (and replaces it with U+FFFD when decoding).
// Strings are skipped eight bytes at a time while they hold no quote,
// backslash or control character.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

const maxJSONDepth = 1000

type jsonScanner struct {
	b []byte
	i int
}

type jsonSyntaxError struct {
	msg string
	off int
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.msg, e.off)
}

func (s *jsonScanner) fail(msg string) error {
	return &jsonSyntaxError{msg: msg, off: s.i}
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *jsonScanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// str reads a string at s.i (which is '"'); it returns the content span
// (without quotes) and whether it holds escapes.
func (s *jsonScanner) str() (start, end int, escaped bool, err error) {
	s.i++ // opening quote
	start = s.i
	b := s.b
	for {
		// Eight bytes at a time while none is '"', '\\' or below 0x20.
		for s.i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[s.i:])
			q := x ^ (lo8 * '"')
			bs := x ^ (lo8 * '\\')
			t := (((q - lo8) &^ q) | ((bs - lo8) &^ bs) | ((x - lo8*0x20) &^ x)) & hi8
			if t != 0 {
				// The lowest flagged byte is a real hit: a borrow only
				// flags bytes above the one that caused it.
				s.i += bits.TrailingZeros64(t) / 8
				break
			}
			s.i += 8
		}
		if s.i >= len(b) {
			return 0, 0, false, s.fail("unterminated string")
		}
		c := b[s.i]
		switch {
		case c == '"':
			end = s.i
			s.i++
			return start, end, escaped, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(b) {
				return 0, 0, false, s.fail("unterminated string")
			}
			switch b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(b) {
					return 0, 0, false, s.fail("bad \\u escape")
				}
				for _, h := range b[s.i+2 : s.i+6] {
					if !isHex(h) {
						return 0, 0, false, s.fail("bad \\u escape")
					}
				}
				s.i += 6
			default:
				return 0, 0, false, s.fail("bad escape")
			}
		case c < 0x20:
			return 0, 0, false, s.fail("control character in string")
		default:
			s.i++
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *jsonScanner) number() error {
	b := s.b
	if s.i < len(b) && b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(b) && b[s.i] == '0':
		s.i++
	case s.i < len(b) && b[s.i] >= '1' && b[s.i] <= '9':
		for s.i < len(b) && isDigit(b[s.i]) {
			s.i++
		}
	default:
		return s.fail("bad number")
	}
	if s.i < len(b) && b[s.i] == '.' {
		s.i++
		if s.i >= len(b) || !isDigit(b[s.i]) {
			return s.fail("bad number")
		}
		for s.i < len(b) && isDigit(b[s.i]) {
			s.i++
		}
	}
	if s.i < len(b) && (b[s.i] == 'e' || b[s.i] == 'E') {
		s.i++
		if s.i < len(b) && (b[s.i] == '+' || b[s.i] == '-') {
			s.i++
		}
		if s.i >= len(b) || !isDigit(b[s.i]) {
			return s.fail("bad number")
		}
		for s.i < len(b) && isDigit(b[s.i]) {
			s.i++
		}
	}
	return nil
}

func (s *jsonScanner) literal(lit string) error {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return s.fail("invalid character")
	}
	s.i += len(lit)
	return nil
}

// value skips one value, validating it, and returns its span.
func (s *jsonScanner) value(depth int) (start, end int, err error) {
	c := s.peek()
	start = s.i
	switch {
	case c == '"':
		_, _, _, err = s.str()
	case c == '{':
		err = s.object(depth+1, func(int, int, bool) error {
			_, _, err := s.value(depth + 1)
			return err
		})
	case c == '[':
		err = s.array(depth+1, func() error {
			_, _, err := s.value(depth + 1)
			return err
		})
	case c == '-' || isDigit(c):
		err = s.number()
	case c == 't':
		err = s.literal("true")
	case c == 'f':
		err = s.literal("false")
	case c == 'n':
		err = s.literal("null")
	case c == 0:
		err = s.fail("unexpected end of JSON")
	default:
		err = s.fail(fmt.Sprintf("invalid character %q", c))
	}
	return start, s.i, err
}

// object reads an object at s.i; for each member it calls member with the
// key's span, leaving s.i at the value, which member must consume.
func (s *jsonScanner) object(depth int, member func(kstart, kend int, kescaped bool) error) error {
	if depth > maxJSONDepth {
		return s.fail("nested too deeply")
	}
	s.i++ // '{'
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.fail("want an object key")
		}
		ks, ke, kesc, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.fail("want ':' after object key")
		}
		s.i++
		if err := member(ks, ke, kesc); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.fail("want ',' or '}' in object")
		}
	}
}

// array reads an array at s.i, calling elem with s.i at each element, which
// elem must consume.
func (s *jsonScanner) array(depth int, elem func() error) error {
	if depth > maxJSONDepth {
		return s.fail("nested too deeply")
	}
	s.i++ // '['
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		s.ws()
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.fail("want ',' or ']' in array")
		}
	}
}

// end checks that nothing but space follows the top-level value.
func (s *jsonScanner) end() error {
	if s.ws(); s.i < len(s.b) {
		return s.fail("data after the top-level value")
	}
	return nil
}

// key returns an object key's text.
func (s *jsonScanner) key(ks, ke int, escaped bool) string {
	if !escaped {
		return string(s.b[ks:ke])
	}
	var k string
	_ = json.Unmarshal(s.b[ks-1:ke+1], &k) // validated already
	return k
}

// fieldError reports a field of the wrong JSON type.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

func wrongType(format string, args ...any) error {
	return &fieldError{msg: fmt.Sprintf(format, args...)}
}

// stringValue reads a string value (or null, as "") at s.i.
func (s *jsonScanner) stringValue(field string) (string, bool, error) {
	switch s.peek() {
	case '"':
		st, en, esc, err := s.str()
		if err != nil {
			return "", false, err
		}
		if !esc {
			return string(s.b[st:en]), true, nil
		}
		var v string
		if err := json.Unmarshal(s.b[st-1:en+1], &v); err != nil {
			return "", false, err
		}
		return v, true, nil
	case 'n':
		return "", false, s.literal("null")
	}
	return "", false, wrongType("%s: want a string", field)
}

// intValue reads an integer value (or null, as absent) at s.i.
func (s *jsonScanner) intValue(field string) (int64, bool, error) {
	c := s.peek()
	if c == 'n' {
		return 0, false, s.literal("null")
	}
	if c != '-' && !isDigit(c) {
		return 0, false, wrongType("%s: want an integer", field)
	}
	st := s.i
	if err := s.number(); err != nil {
		return 0, false, err
	}
	v, err := strconv.ParseInt(string(s.b[st:s.i]), 10, 64)
	if err != nil {
		return 0, false, wrongType("%s: want an integer, got %s", field, s.b[st:s.i])
	}
	return v, true, nil
}

// boolValue reads a boolean value (or null, as false) at s.i.
func (s *jsonScanner) boolValue(field string) (bool, error) {
	switch s.peek() {
	case 't':
		return true, s.literal("true")
	case 'f':
		return false, s.literal("false")
	case 'n':
		return false, s.literal("null")
	}
	return false, wrongType("%s: want a boolean", field)
}

// topField is a member of a request's object that an estimator reads: its
// value's span and, for an array when collect is set, the spans of its
// elements.
type topField struct {
	name    string
	collect bool
	present bool
	val     span
	elems   []span
}

// scanTop validates body as one JSON object and fills in the fields found.
//
// The fields are the ones costgate prices by, and an upstream may read them
// by other rules than costgate's: encoding/json matches keys
// case-insensitively and keeps the last of repeated ones, other decoders
// match exactly, and some keep the first. So that every upstream reads
// what costgate priced, a key that equals a field's name but for case (as
// encoding/json folds it) is rejected, and so is a field that appears
// twice: either is a *BadRequestError naming the field. The check is part
// of the one scan.
func scanTop(kind Kind, body []byte, fields ...*topField) error {
	return scanFields(kind, "", body, fields)
}

// scanFields is scanTop for the object body at the path prefix ("" for the
// top level, "stream_options." for a nested object).
func scanFields(kind Kind, prefix string, body []byte, fields []*topField) error {
	s := jsonScanner{b: body}
	switch s.peek() {
	case '{':
	case 0:
		if s.i >= len(body) {
			return badRequest(kind, nil, "empty body")
		}
		return badRequest(kind, &jsonSyntaxError{msg: "invalid character", off: s.i}, "invalid JSON")
	default:
		if _, _, err := s.value(0); err != nil {
			return badRequest(kind, err, "invalid JSON")
		}
		if prefix != "" {
			return badRequest(kind, nil, "%s: want an object", prefix[:len(prefix)-1])
		}
		return badRequest(kind, nil, "want a JSON object")
	}
	err := s.object(1, func(ks, ke int, esc bool) error {
		name := s.b[ks:ke]
		if esc {
			name = []byte(s.key(ks, ke, true))
		}
		f, err := matchField(prefix, name, fields)
		if err != nil {
			return err
		}
		if f == nil {
			_, _, err := s.value(1)
			return err
		}
		f.present = true
		f.elems = f.elems[:0]
		if f.collect && s.peek() == '[' {
			f.val.start = s.i
			err := s.array(2, func() error {
				st, en, err := s.value(2)
				f.elems = append(f.elems, span{st, en})
				return err
			})
			f.val.end = s.i
			return err
		}
		f.val.start, f.val.end, err = s.value(1)
		return err
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) {
			return badRequest(kind, nil, "%s", fe.msg)
		}
		return badRequest(kind, err, "invalid JSON")
	}
	return nil
}

// matchField returns the field a key names, nil for a key that names none,
// or an error for a key that is a case variant of a field, or a field seen
// before.
func matchField(prefix string, key []byte, fields []*topField) (*topField, error) {
	for _, f := range fields {
		// A case variant is never shorter: the non-ASCII letters that fold
		// to ASCII ones (U+017F, U+212A) take more bytes.
		if len(key) < len(f.name) || (len(key) == len(f.name) && key[0]|0x20 != f.name[0]|0x20) {
			continue
		}
		if string(key) == f.name {
			if f.present {
				return nil, wrongType("%s%s: the field appears twice", prefix, f.name)
			}
			return f, nil
		}
		if bytes.EqualFold(key, []byte(f.name)) {
			return nil, wrongType("%s%s: the field is spelled %q; priced fields must be spelled exactly", prefix, f.name, key)
		}
	}
	return nil, nil
}

// raw returns the field's value, or nil when absent or null.
func (f *topField) raw(body []byte) []byte {
	if !f.present {
		return nil
	}
	v := body[f.val.start:f.val.end]
	if string(v) == "null" {
		return nil
	}
	return v
}

// decodeField decodes a field into v, reporting a wrong type as a bad
// request that names the field. Strings, integers and booleans are read by
// the scanner; anything else, or a value of the wrong type, by
// encoding/json (for its error).
func decodeField(kind Kind, body []byte, f *topField, v any) error {
	raw := f.raw(body)
	if raw == nil {
		return nil
	}
	switch x := v.(type) {
	case *string:
		if raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			*x = string(raw[1 : len(raw)-1])
			return nil
		}
	case *int64:
		if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			*x = n
			return nil
		}
	case *bool:
		switch string(raw) {
		case "true":
			*x = true
			return nil
		case "false":
			*x = false
			return nil
		}
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return badRequest(kind, nil, "%s: want %s, got JSON %s", f.name, jsonTypeName(v), te.Value)
		}
		return badRequest(kind, err, "%s", f.name)
	}
	return nil
}

// decodeString, decodeInt and decodeBool are decodeField for one type,
// without boxing the value (which would move it to the heap).
func decodeString(kind Kind, body []byte, f *topField) (string, error) {
	raw := f.raw(body)
	if raw != nil && raw[0] == '"' && bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	err := decodeField(kind, body, f, &v)
	return v, err
}

func decodeInt(kind Kind, body []byte, f *topField) (int64, error) {
	raw := f.raw(body)
	if raw != nil && raw[0] != '"' {
		if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
			return n, nil
		}
	}
	var v int64
	err := decodeField(kind, body, f, &v)
	return v, err
}

func decodeBool(kind Kind, body []byte, f *topField) (bool, error) {
	switch raw := f.raw(body); string(raw) {
	case "true":
		return true, nil
	case "false", "":
		return false, nil
	}
	var v bool
	err := decodeField(kind, body, f, &v)
	return v, err
}

func jsonTypeName(v any) string {
	switch v.(type) {
	case *string:
		return "a string"
	case *int64, **int64:
		return "an integer"
	case *bool:
		return "a boolean"
	}
	return "an object"
}
