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

	"github.com/costgate/costgate/internal/jsonscan"
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
	r := jsonReader{Scanner: jsonscan.Scanner{B: raw, MaxDepth: maxJSONDepth}}
	switch r.Peek() {
	case 0:
		return r.Fail("no JSON value")
	case '{':
		if err := r.object(v, apiNames); err != nil {
			return err
		}
	case 'n':
		if err := r.skip(); err != nil {
			return err
		}
	default:
		if err := r.skip(); err != nil {
			return err
		}
		return errors.New("the body must be a JSON object")
	}
	return r.End()
}

// jsonReader reads an API body on the shared scanner; depth is the
// nesting of the value at the scanner's position (0 at the top).
type jsonReader struct {
	jsonscan.Scanner
	depth int
}

// skip checks the value at the scanner's position and moves past it.
func (r *jsonReader) skip() error {
	_, _, err := r.Value(r.depth)
	return err
}

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

// nameRule is how object checks an object's member names.
type nameRule uint8

const (
	anyNames  nameRule = iota // not at all: inside an LLM body or response
	apiNames                  // once each, in lower case, and known to into (its member refuses others)
	attrNames                 // once each
)

// object reads the object at the scanner's position, handing each
// member's value to into, its member names checked by rule. A name written
// with an escape or beyond ASCII is decoded by encoding/json first.
func (r *jsonReader) object(into apiBody, rule nameRule) error {
	var seen nameSet
	outer := r.depth
	defer func() { r.depth = outer }()
	return r.Object(outer+1, func(ks, ke int, escaped bool) error {
		name := r.B[ks:ke]
		if escaped || !ascii(name) {
			var s string
			if err := json.Unmarshal(r.B[ks-1:ke+1], &s); err != nil {
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
		r.depth = outer + 1
		return into.member(r, name)
	})
}

// ascii tells whether b holds no byte beyond ASCII: a string that does is
// decoded by encoding/json, which replaces invalid UTF-8.
func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// typeError is the error of a member whose value json.Unmarshal would not
// put into its field.
func typeError(name []byte, want string) error {
	return fmt.Errorf("%s: want %s", name, want)
}

// string reads the value at r.I into s: a string, or null (s unchanged).
func (r *jsonReader) string(name []byte, s *string) error {
	switch r.Peek() {
	case '"':
		start, end, escaped, err := r.Str()
		if err != nil {
			return err
		}
		if text := r.B[start:end]; !escaped && ascii(text) {
			*s = string(text)
			return nil
		}
		return json.Unmarshal(r.B[start-1:end+1], s)
	case 'n':
		return r.Literal("null")
	}
	if err := r.skip(); err != nil {
		return err
	}
	return typeError(name, "a string")
}

// int64 reads the value at r.I into n: an integer, or null (n unchanged).
func (r *jsonReader) int64(name []byte, n *int64) error {
	switch c := r.Peek(); {
	case c == 'n':
		return r.Literal("null")
	case c == '-' || jsonscan.IsDigit(c):
		start := r.I
		if err := r.Number(); err != nil {
			return err
		}
		v, err := strconv.ParseInt(string(r.B[start:r.I]), 10, 64)
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

// raw reads the value at r.I into m as written, null included (as
// json.RawMessage's UnmarshalJSON keeps it).
func (r *jsonReader) raw(m *json.RawMessage) error {
	start, end, err := r.Value(r.depth)
	if err != nil {
		return err
	}
	*m = append((*m)[:0], r.B[start:end]...)
	return nil
}

// attributes reads the value at r.I into *m: an object of strings (into a
// new map; a null value is "", as json.Unmarshal reads one into a
// map[string]string), or null (nil).
func (r *jsonReader) attributes(name []byte, m *map[string]string) error {
	switch r.Peek() {
	case 'n':
		*m = nil
		return r.Literal("null")
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

// amounts reads the value at r.I into *a: an object (into a new amounts),
// or null (nil).
func (r *jsonReader) amounts(name []byte, a **amounts) error {
	switch r.Peek() {
	case 'n':
		*a = nil
		return r.Literal("null")
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
		if r.Peek() == 'n' {
			a.Requests = nil
			return r.Literal("null")
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
