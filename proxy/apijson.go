package proxy

// readAPIBody reads a reserve, settle or release body in one pass over its
// bytes: it checks that the body is one valid JSON value, that its member
// names are the API's, and decodes them as json.Unmarshal would
// (FuzzReadAPIBody holds the two to the same answers), without
// encoding/json's second scan of the whole body and its reflection.
// Strings with an escape or a byte beyond ASCII are handed to
// json.Unmarshal itself, so that their reading is encoding/json's to the
// byte.
//
// The names: encoding/json matches a member to a field without regard to
// case (and folds "ſ" to "s") and keeps the last of a member given twice,
// so a body could carry two costs, one that a case-sensitive reader (a
// log, a gateway, the caller's own tooling) sees and one that costgate
// charges. Every member name of the API's objects is therefore spelled
// exactly as documented (lower-case ASCII), given once, and known; an
// attribute name is given once (checkAttributes checks the rest); the LLM
// body or response to estimate ("body", "response") is the estimator's to
// check.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// apiBody is a body type readAPIBody decodes: member reads the value of
// member name at r's position into the body, or skips it.
type apiBody interface {
	member(r *jsonReader, name []byte) error
}

// maxJSONDepth is encoding/json's bound on nesting: a value nested deeper
// is refused.
const maxJSONDepth = 10000

// readAPIBody reads raw into v. A body that is null leaves v as it is, as
// json.Unmarshal does; any other value than an object is refused.
func readAPIBody(raw []byte, v apiBody) error {
	r := jsonReader{b: raw}
	r.space()
	switch {
	case r.i >= len(r.b):
		return r.fail("no JSON value")
	case r.b[r.i] == '{':
		if err := r.object(v, apiNames); err != nil {
			return err
		}
	case r.b[r.i] == 'n':
		if err := r.skip(); err != nil {
			return err
		}
	default:
		if err := r.skip(); err != nil {
			return err
		}
		return errors.New("the body must be a JSON object")
	}
	r.space()
	if r.i < len(r.b) {
		return r.fail("more than one JSON value")
	}
	return nil
}

// jsonReader reads JSON from b at i.
type jsonReader struct {
	b     []byte
	i     int
	depth int
}

func (r *jsonReader) fail(what string) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", r.i, what)
}

func (r *jsonReader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// peek is the first byte of the value at r.i, after white space; 0 at the
// end.
func (r *jsonReader) peek() byte {
	r.space()
	if r.i >= len(r.b) {
		return 0
	}
	return r.b[r.i]
}

// skipper skips every member of an object.
type skipper struct{}

func (skipper) member(r *jsonReader, _ []byte) error { return r.skip() }

// unknownField is the error of a member name the API does not have.
func unknownField(name []byte) error { return fmt.Errorf("json: unknown field %q", name) }

// nameSet is the member names of one object seen so far: in an array
// while they are few, as the API's objects' are, then in a map.
type nameSet struct {
	small [16][]byte
	n     int
	big   map[string]bool
}

// has tells whether name was seen, and adds it.
func (s *nameSet) has(name []byte) bool {
	if s.big != nil {
		if s.big[string(name)] {
			return true
		}
		s.big[string(name)] = true
		return false
	}
	for _, o := range s.small[:s.n] {
		if bytes.Equal(o, name) {
			return true
		}
	}
	if s.n < len(s.small) {
		s.small[s.n] = name
		s.n++
		return false
	}
	s.big = make(map[string]bool, 2*len(s.small))
	for _, o := range s.small {
		s.big[string(o)] = true
	}
	s.big[string(name)] = true
	return false
}

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

// skip checks the value at r.i and moves past it.
func (r *jsonReader) skip() error {
	switch c := r.peek(); c {
	case 0:
		return r.fail("unexpected end")
	case '{':
		return r.object(skipper{}, anyNames)
	case '[':
		return r.array()
	case '"':
		_, _, err := r.str()
		return err
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	default:
		_, err := r.number()
		return err
	}
}

func (r *jsonReader) literal(word string) error {
	if len(r.b)-r.i < len(word) || string(r.b[r.i:r.i+len(word)]) != word {
		return r.fail("invalid literal")
	}
	r.i += len(word)
	return nil
}

func (r *jsonReader) enter() error {
	r.depth++
	if r.depth > maxJSONDepth {
		return r.fail("nested too deep")
	}
	r.i++
	return nil
}

// nameRule is how object checks an object's member names.
type nameRule uint8

const (
	anyNames  nameRule = iota // not at all: inside an LLM body or response
	apiNames                  // once each, in lower case, and known to into (its member refuses others)
	attrNames                 // once each
)

// object reads the object at r.i, handing each member's value to into,
// its member names checked by rule. A name written with an escape or
// beyond ASCII is decoded by encoding/json first.
func (r *jsonReader) object(into apiBody, rule nameRule) error {
	if err := r.enter(); err != nil {
		return err
	}
	if r.peek() == '}' {
		r.i++
		r.depth--
		return nil
	}
	var seen nameSet
	for {
		if r.peek() != '"' {
			return r.fail("want a member name")
		}
		start := r.i
		name, special, err := r.str()
		if err != nil {
			return err
		}
		if special {
			var s string
			if err := json.Unmarshal(r.b[start:r.i], &s); err != nil {
				return err
			}
			name = []byte(s)
		}
		if rule != anyNames {
			if seen.has(name) {
				return fmt.Errorf("field %q appears twice", name)
			}
			if rule == apiNames && !lowerName(name) {
				return fmt.Errorf("field %q: fields are spelled in lower case, exactly as documented", name)
			}
		}
		if r.peek() != ':' {
			return r.fail("want a colon")
		}
		r.i++
		if err := into.member(r, name); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.i++
		case '}':
			r.i++
			r.depth--
			return nil
		default:
			return r.fail("want a comma or the object's end")
		}
	}
}

func (r *jsonReader) array() error {
	if err := r.enter(); err != nil {
		return err
	}
	if r.peek() == ']' {
		r.i++
		r.depth--
		return nil
	}
	for {
		if err := r.skip(); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.i++
		case ']':
			r.i++
			r.depth--
			return nil
		default:
			return r.fail("want a comma or the array's end")
		}
	}
}

// str reads the string at r.i and returns its text as written, and
// whether it holds an escape or a byte beyond ASCII.
func (r *jsonReader) str() (text []byte, special bool, err error) {
	r.i++ // '"'
	start := r.i
	for r.i < len(r.b) {
		switch c := r.b[r.i]; {
		case c == '"':
			text = r.b[start:r.i]
			r.i++
			return text, special, nil
		case c == '\\':
			special = true
			if r.i+1 >= len(r.b) {
				return nil, false, r.fail("unterminated string")
			}
			switch r.b[r.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				r.i += 2
			case 'u':
				if len(r.b)-r.i < 6 || !isHex(r.b[r.i+2]) || !isHex(r.b[r.i+3]) || !isHex(r.b[r.i+4]) || !isHex(r.b[r.i+5]) {
					return nil, false, r.fail("invalid \\u escape")
				}
				r.i += 6
			default:
				return nil, false, r.fail("invalid escape")
			}
		case c < 0x20:
			return nil, false, r.fail("control character in a string")
		default:
			special = special || c >= 0x80
			r.i++
		}
	}
	return nil, false, r.fail("unterminated string")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number reads the number at r.i and returns it as written.
func (r *jsonReader) number() ([]byte, error) {
	start := r.i
	if r.i < len(r.b) && r.b[r.i] == '-' {
		r.i++
	}
	switch {
	case r.i >= len(r.b):
		return nil, r.fail("invalid number")
	case r.b[r.i] == '0':
		r.i++
	case '1' <= r.b[r.i] && r.b[r.i] <= '9':
		r.digits()
	default:
		return nil, r.fail("invalid value")
	}
	if r.i < len(r.b) && r.b[r.i] == '.' {
		r.i++
		if r.i >= len(r.b) || !isDigit(r.b[r.i]) {
			return nil, r.fail("invalid number")
		}
		r.digits()
	}
	if r.i < len(r.b) && (r.b[r.i] == 'e' || r.b[r.i] == 'E') {
		r.i++
		if r.i < len(r.b) && (r.b[r.i] == '+' || r.b[r.i] == '-') {
			r.i++
		}
		if r.i >= len(r.b) || !isDigit(r.b[r.i]) {
			return nil, r.fail("invalid number")
		}
		r.digits()
	}
	return r.b[start:r.i], nil
}

func (r *jsonReader) digits() {
	for r.i < len(r.b) && isDigit(r.b[r.i]) {
		r.i++
	}
}

// typeError is the error of a member whose value json.Unmarshal would not
// put into its field.
func typeError(name []byte, want string) error {
	return fmt.Errorf("%s: want %s", name, want)
}

// string reads the value at r.i into s: a string, or null (s unchanged).
func (r *jsonReader) string(name []byte, s *string) error {
	switch r.peek() {
	case '"':
		start := r.i
		text, special, err := r.str()
		if err != nil {
			return err
		}
		if !special {
			*s = string(text)
			return nil
		}
		return json.Unmarshal(r.b[start:r.i], s)
	case 'n':
		return r.literal("null")
	}
	if err := r.skip(); err != nil {
		return err
	}
	return typeError(name, "a string")
}

// int64 reads the value at r.i into n: an integer, or null (n unchanged).
func (r *jsonReader) int64(name []byte, n *int64) error {
	switch c := r.peek(); {
	case c == 'n':
		return r.literal("null")
	case c == '-' || isDigit(c):
		text, err := r.number()
		if err != nil {
			return err
		}
		v, err := strconv.ParseInt(string(text), 10, 64)
		if err != nil {
			return typeError(name, "an integer within 64 bits")
		}
		*n = v
		return nil
	}
	if err := r.skip(); err != nil {
		return err
	}
	return typeError(name, "an integer")
}

// raw reads the value at r.i into m as written, null included (as
// json.RawMessage's UnmarshalJSON keeps it).
func (r *jsonReader) raw(m *json.RawMessage) error {
	r.space()
	start := r.i
	if err := r.skip(); err != nil {
		return err
	}
	*m = append((*m)[:0], r.b[start:r.i]...)
	return nil
}

// attributes reads the value at r.i into *m: an object of strings (into a
// new map; a null value is "", as json.Unmarshal reads one into a
// map[string]string), or null (nil).
func (r *jsonReader) attributes(name []byte, m *map[string]string) error {
	switch r.peek() {
	case 'n':
		*m = nil
		return r.literal("null")
	case '{':
		*m = map[string]string{}
		return r.object(attrMap(*m), attrNames)
	}
	if err := r.skip(); err != nil {
		return err
	}
	return typeError(name, "an object")
}

// attrMap reads an attributes object's members.
type attrMap map[string]string

func (m attrMap) member(r *jsonReader, name []byte) error {
	var v string
	if err := r.string(name, &v); err != nil {
		return err
	}
	m[string(name)] = v
	return nil
}

// amounts reads the value at r.i into *a: an object (into a new amounts),
// or null (nil).
func (r *jsonReader) amounts(name []byte, a **amounts) error {
	switch r.peek() {
	case 'n':
		*a = nil
		return r.literal("null")
	case '{':
		*a = new(amounts)
		return r.object(*a, apiNames)
	}
	if err := r.skip(); err != nil {
		return err
	}
	return typeError(name, "an object")
}

func (a *amounts) member(r *jsonReader, name []byte) error {
	switch string(name) {
	case "requests":
		switch r.peek() {
		case 'n':
			a.Requests = nil
			return r.literal("null")
		}
		var n int64
		if err := r.int64(name, &n); err != nil {
			return err
		}
		a.Requests = &n
		return nil
	case "tokens":
		return r.int64(name, &a.Tokens)
	case "input_tokens":
		return r.int64(name, &a.InputTokens)
	case "output_tokens":
		return r.int64(name, &a.OutputTokens)
	case "units":
		return r.int64(name, &a.Units)
	case "usd":
		return r.string(name, &a.USD)
	}
	return unknownField(name)
}

func (in *reserveRequest) member(r *jsonReader, name []byte) error {
	switch string(name) {
	case "cost":
		return r.amounts(name, &in.Cost)
	case "kind":
		return r.string(name, &in.Kind)
	case "body":
		return r.raw(&in.Body)
	case "upstream":
		return r.string(name, &in.Upstream)
	case "model":
		return r.string(name, &in.Model)
	case "route":
		return r.string(name, &in.Route)
	case "ttl":
		return r.string(name, &in.TTL)
	case "attributes":
		return r.attributes(name, &in.Attributes)
	}
	return unknownField(name)
}

func (in *settleRequest) member(r *jsonReader, name []byte) error {
	switch string(name) {
	case "reservation_id":
		return r.string(name, &in.ReservationID)
	case "usage":
		return r.amounts(name, &in.Usage)
	case "response":
		return r.raw(&in.Response)
	case "kind":
		return r.string(name, &in.Kind)
	case "status":
		return r.string(name, &in.Status)
	case "model":
		return r.string(name, &in.Model)
	}
	return unknownField(name)
}

// releaseRequest is a release body.
type releaseRequest struct {
	ReservationID string `json:"reservation_id"`
}

func (in *releaseRequest) member(r *jsonReader, name []byte) error {
	if string(name) == "reservation_id" {
		return r.string(name, &in.ReservationID)
	}
	return unknownField(name)
}
