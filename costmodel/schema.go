package costmodel

// Counting tool definitions beyond what the cookbook walks.
//
// The cookbook's num_tokens_for_tools reads a function's parameters only
// through their properties: per property its name, type, description and
// enum (toolTokens). schemaTokens walks the same way, and counts nested
// properties (an object property's, an array's items') like top-level
// ones. Every other member of a schema (anyOf, oneOf, allOf, $defs,
// examples, default, const, title, pattern, an additionalProperties
// schema, a description of the parameters or of an array's items,
// keywords newer than this code) is counted as the text of its JSON, key
// and value: an upper bound of whatever the upstream renders of it, so
// that text hidden there counts at least as much as in a description.
// Left free are only members that render no text of the client's beyond
// what is counted: a type naming JSON types where only properties are
// read, a required entry naming a property, a boolean
// additionalProperties. A schema made only of what the cookbook walks
// counts exactly what it counts.
//
// unreadTokens does the same for the members of a tool or a function that
// costgate does not read (an Anthropic tool's input_examples, members
// newer than this code).

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/costgate/costgate/internal/jsonscan"
)

// schemaTokens returns the tokens of raw, a function's parameters schema
// (JSON): the cookbook's walk of its properties, plus the JSON text of
// every member the walk does not read.
func schemaTokens(m model, raw []byte) (int64, error) {
	w := schemaWalk{m: m, s: jsonscan.Scanner{B: raw}}
	if err := w.schema(0, false, ""); err != nil {
		return 0, err
	}
	return w.n, w.s.End()
}

type schemaWalk struct {
	m model
	s jsonscan.Scanner
	n int64 // tokens counted so far
}

// text counts B[from:to], JSON text, as text.
func (w *schemaWalk) text(from, to int) {
	w.n = addSat(w.n, w.m.countText(string(w.s.B[from:to])))
}

// schema walks the schema at s.I, depth deep: a property's, named name,
// when prop; else one of which the cookbook reads only the properties
// (the parameters, an array's items).
func (w *schemaWalk) schema(depth int, prop bool, name string) error {
	var (
		typ, desc          string
		readType, readDesc bool
		readEnum           bool
		names              []string // the properties' names, for required
		reqFrom, reqTo     int      // required's array, when it has one
	)
	if w.s.Peek() != '{' {
		st, en, err := w.s.Value(depth)
		if err != nil {
			return err
		}
		if string(w.s.B[st:en]) != "null" {
			w.text(st, en) // a boolean schema, or no schema at all
		}
	} else {
		err := w.s.Object(depth+1, func(ks, ke int, esc bool) error {
			k := w.s.B[ks:ke]
			if esc {
				k = []byte(w.s.Key(ks, ke, esc))
			}
			switch c := w.s.Peek(); {
			case string(k) == "properties" && c == '{':
				return w.properties(depth+1, &names)
			case string(k) == "items" && c == '{':
				return w.schema(depth+1, false, "")
			case string(k) == "required" && reqTo == 0 && c == '[':
				var err error
				reqFrom, reqTo, err = w.s.Value(depth + 1)
				return err
			}
			st, en, err := w.s.Value(depth + 1)
			if err != nil {
				return err
			}
			v := w.s.B[st:en]
			switch {
			case prop && string(k) == "type" && !readType:
				typ, readType = stringText(v), true
				return nil
			case !prop && string(k) == "type" && typeNames(v):
				return nil
			case prop && string(k) == "description" && !readDesc:
				readDesc = true
				return json.Unmarshal(v, &desc)
			case prop && string(k) == "enum" && !readEnum && v[0] == '[':
				readEnum = true
				w.enum(v)
				return nil
			case string(k) == "additionalProperties" && (string(v) == "true" || string(v) == "false"):
				return nil
			}
			w.text(ks-1, en) // from the key's quote
			return nil
		})
		if err != nil {
			return err
		}
	}
	if prop {
		w.n = addSat(w.n, w.m.countText(name+":"+typ+":"+strings.TrimSuffix(desc, ".")))
	}
	if reqTo > 0 {
		w.required(reqFrom, reqTo, names)
	}
	return nil
}

// properties walks a properties object at s.I, depth deep, appending its
// names to names.
func (w *schemaWalk) properties(depth int, names *[]string) error {
	first := true
	return w.s.Object(depth+1, func(ks, ke int, esc bool) error {
		if first {
			w.n, first = addSat(w.n, toolPropInit), false
		}
		name := w.s.Key(ks, ke, esc)
		*names = append(*names, name)
		w.n = addSat(w.n, toolPropKey)
		return w.schema(depth+1, true, name)
	})
}

// enum counts a property's enum, v, a JSON array.
func (w *schemaWalk) enum(v []byte) {
	s := jsonscan.Scanner{B: v}
	n := int64(0)
	_ = s.Array(1, func() error { // v is valid JSON
		st, en, err := s.Value(1)
		n = addSat(n, toolEnumItem+w.m.countText(stringText(v[st:en])))
		return err
	})
	if n > 0 { // at least toolEnumItem: the sum is not negative
		w.n = addSat(w.n, n+toolEnumInit)
	}
}

// required counts the entries of required, B[from:to], a JSON array, that
// do not name a property of names (each name once): their text.
func (w *schemaWalk) required(from, to int, names []string) {
	s := jsonscan.Scanner{B: w.s.B[:to], I: from}
	_ = s.Array(1, func() error { // valid JSON
		st, en, err := s.Value(1)
		if v := s.B[st:en]; v[0] == '"' {
			for i, name := range names {
				if stringIs(v, name) {
					names[i] = names[len(names)-1]
					names = names[:len(names)-1]
					return err
				}
			}
		}
		w.text(st, en)
		return err
	})
}

// typeNames reports whether v, a schema's type, names JSON types (a name
// or an array of names): a word the upstream renders, not the client's
// text.
func typeNames(v []byte) bool {
	if v[0] == '[' {
		s := jsonscan.Scanner{B: v}
		ok := true
		_ = s.Array(1, func() error {
			st, en, err := s.Value(1)
			ok = ok && v[st] != '[' && typeNames(v[st:en])
			return err
		})
		return ok
	}
	switch string(v) {
	case `"object"`, `"array"`, `"string"`, `"number"`, `"integer"`, `"boolean"`, `"null"`:
		return true
	}
	return false
}

// stringText returns the value of v, a JSON string, or the JSON text of
// any other value (a number, an array of types), as jsonScalarText does;
// a string without escapes is not decoded.
func stringText(v []byte) string {
	if len(v) >= 2 && v[0] == '"' && bytes.IndexByte(v, '\\') < 0 && utf8.Valid(v) {
		return string(v[1 : len(v)-1])
	}
	return jsonScalarText(v)
}

// stringIs reports whether v, a JSON string, holds s.
func stringIs(v []byte, s string) bool {
	if bytes.IndexByte(v, '\\') < 0 {
		return len(v) == len(s)+2 && string(v[1:len(v)-1]) == s
	}
	var d string
	return json.Unmarshal(v, &d) == nil && d == s
}

// unreadTokens returns the tokens of the members of raw, a JSON object,
// whose keys are not among read (compared exactly, as an upstream does):
// each member's JSON text, key and value, an upper bound of what the
// upstream renders of a member of a definition that costgate does not
// read. It is 0 when raw is not an object, and then, or when every member
// is read, allocates nothing.
func unreadTokens(m model, raw []byte, read []string) int64 {
	s := jsonscan.Scanner{B: raw}
	if s.Peek() != '{' {
		return 0
	}
	var n int64
	_ = s.Object(1, func(ks, ke int, esc bool) error { // raw is valid JSON
		_, end, err := s.Value(1)
		if !esc {
			for _, r := range read {
				if string(raw[ks:ke]) == r {
					return err
				}
			}
		}
		n = addSat(n, m.countText(string(raw[ks-1:end])))
		return err
	})
	return n
}
