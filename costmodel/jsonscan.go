package costmodel

// costmodel's readers of JSON on the hot path: the fields of a request
// body (scanTop) and typed values, on the shared strict scanner
// (internal/jsonscan), which makes one validating pass and hands back byte
// spans, so that a message whose count is cached is never decoded at all.
// The fuzz tests hold them to encoding/json.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/costgate/costgate/internal/jsonscan"
)

// jsonScanner is the shared scanner with costmodel's readers of values
// (stringValue, intValue, boolValue) and fields (scanTop).
type jsonScanner struct{ jsonscan.Scanner }

// fieldError reports a field of the wrong JSON type.
type fieldError struct{ msg string }

func (e *fieldError) Error() string { return e.msg }

func wrongType(format string, args ...any) error {
	return &fieldError{msg: fmt.Sprintf(format, args...)}
}

// stringValue reads a string value (or null, as "") at s.I.
func (s *jsonScanner) stringValue(field string) (string, bool, error) {
	switch s.Peek() {
	case '"':
		st, en, esc, err := s.Str()
		if err != nil {
			return "", false, err
		}
		if !esc {
			return string(s.B[st:en]), true, nil
		}
		var v string
		if err := json.Unmarshal(s.B[st-1:en+1], &v); err != nil {
			return "", false, err
		}
		return v, true, nil
	case 'n':
		return "", false, s.Literal("null")
	}
	return "", false, wrongType("%s: want a string", field)
}

// intValue reads an integer value (or null, as absent) at s.I.
func (s *jsonScanner) intValue(field string) (int64, bool, error) {
	c := s.Peek()
	if c == 'n' {
		return 0, false, s.Literal("null")
	}
	if c != '-' && !jsonscan.IsDigit(c) {
		return 0, false, wrongType("%s: want an integer", field)
	}
	st := s.I
	if err := s.Number(); err != nil {
		return 0, false, err
	}
	v, err := strconv.ParseInt(string(s.B[st:s.I]), 10, 64)
	if err != nil {
		return 0, false, wrongType("%s: want an integer, got %s", field, s.B[st:s.I])
	}
	return v, true, nil
}

// boolValue reads a boolean value (or null, as false) at s.I.
func (s *jsonScanner) boolValue(field string) (bool, error) {
	switch s.Peek() {
	case 't':
		return true, s.Literal("true")
	case 'f':
		return false, s.Literal("false")
	case 'n':
		return false, s.Literal("null")
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
	s := jsonScanner{jsonscan.Scanner{B: body}}
	switch s.Peek() {
	case '{':
	case 0:
		if s.I >= len(body) {
			return badRequest(kind, nil, "empty body")
		}
		return badRequest(kind, &jsonscan.SyntaxError{Msg: "invalid character", Off: s.I}, "invalid JSON")
	default:
		if _, _, err := s.Value(0); err != nil {
			return badRequest(kind, err, "invalid JSON")
		}
		if prefix != "" {
			return badRequest(kind, nil, "%s: want an object", prefix[:len(prefix)-1])
		}
		return badRequest(kind, nil, "want a JSON object")
	}
	err := s.Object(1, func(ks, ke int, esc bool) error {
		name := s.KeyBytes(ks, ke, esc)
		f, err := matchField(prefix, name, fields)
		if err != nil {
			return err
		}
		if f == nil {
			_, _, err := s.Value(1)
			return err
		}
		f.present = true
		f.elems = f.elems[:0]
		if f.collect && s.Peek() == '[' {
			f.val.start = s.I
			err := s.Array(2, func() error {
				st, en, err := s.Value(2)
				f.elems = append(f.elems, span{st, en})
				return err
			})
			f.val.end = s.I
			return err
		}
		f.val.start, f.val.end, err = s.Value(1)
		return err
	})
	if err == nil {
		err = s.End()
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
