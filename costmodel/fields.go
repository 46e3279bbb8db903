package costmodel

// Where a rule reads a number (or a search query) in a request: a field
// of its JSON body, a query parameter, a field of its form body, a
// header. Each is read in every spelling some upstream reads as the same
// one, without allocating for the common request:
//
//   - a JSON key on the field's path must be spelled exactly and given
//     once: encoding/json (and many servers) match keys in any case and
//     keep the last of a repeated key, other decoders match exactly, some
//     keep the first; a key given twice or in another case is an error;
//   - a query parameter or form field is matched as ParamIs says (any
//     case, '.' or ' ' for '_', leading spaces and a NUL's tail
//     dropped, array brackets after it: "num[]"), a
//     header as HeaderIs says (any case, '_' for '-'); a name whose
//     spellings hold two values is an error;
//   - a body whose Content-Type is application/x-www-form-urlencoded or
//     multipart/form-data is also read as a form, since upstreams read it
//     as they read JSON, and many merge it with the query (Go's
//     Request.FormValue prefers the body, PHP's $_REQUEST, Flask's
//     request.values): the form field named as the JSON field (or as its
//     path in brackets, "params[num]") or as the query parameter is read;
//   - a request that gives two different Content-Types is an error for
//     any read of its body: servers differ in which one they read.
//
// Of the places a request gives the number in, the largest counts (see
// Source.lookup).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/costgate/costgate/internal/jsonscan"
)

// Form body kinds.
const (
	formNone = iota
	formURLEncoded
	formMultipart
)

// reqBody is a request's (or an answer's) body as a rule reads it.
type reqBody struct {
	b    []byte
	form int    // formNone, formURLEncoded or formMultipart
	ct   string // the Content-Type, for a multipart body's boundary
	// notJSON is set once a read found the body not to be JSON.
	notJSON bool
	// typeErr is set when the request gives two different
	// Content-Types: every read of its body fails with it.
	typeErr error
}

// newReqBody reads body as the Content-Type in h says: a form, or JSON.
// A request that gives two different Content-Types cannot be read (see
// contentType).
func newReqBody(body []byte, h http.Header) reqBody {
	d := reqBody{b: body}
	if h == nil {
		return d
	}
	ct, err := contentType(h)
	if err != nil {
		d.typeErr = err
		return d
	}
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.TrimSpace(mt)
	switch {
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		d.form = formURLEncoded
	case strings.EqualFold(mt, "multipart/form-data"):
		d.form, d.ct = formMultipart, ct
	}
	return d
}

// contentType returns the Content-Type h gives the body: the value of
// each of its Content-Type fields, in any spelling a server reads as one
// (HeaderIs), which must all be one.
// Two different ones are an error: servers differ in which they read (Go
// and Node the first; gunicorn's WSGI environ the last, as it sets
// CONTENT_TYPE once per field), and one may read the body as a form
// where another reads it as JSON.
func contentType(h http.Header) (string, error) {
	var ct string
	seen := false
	for k, vs := range h {
		if !HeaderIs(k, "content-type") {
			continue
		}
		for _, v := range vs {
			switch {
			case !seen:
				ct, seen = v, true
			case v != ct:
				return "", fmt.Errorf("the request gives two Content-Types, %q and %q: an upstream may read either", ct, v)
			}
		}
	}
	return ct, nil
}

// jsonKeyError is a key on a priced field's path given twice or in
// another case.
type jsonKeyError struct{ msg string }

func (e *jsonKeyError) Error() string { return e.msg }

// json returns the value at path (dotted; numeric parts index arrays) in
// the JSON body: found is false when the path is absent, or the body
// empty. A body that is not JSON is an error, but for a form body, which
// need not be JSON; so is a key on the path given twice or in another
// case, and a body of two Content-Types. The whole body is checked in one
// pass.
func (d *reqBody) json(path string) (raw []byte, found bool, err error) {
	if d.typeErr != nil {
		return nil, false, d.typeErr
	}
	if d.notJSON {
		if d.form != formNone {
			return nil, false, nil
		}
		return nil, false, errors.New("body is not valid JSON")
	}
	if len(bytes.TrimSpace(d.b)) == 0 {
		return nil, false, nil
	}
	s := jsonscan.Scanner{B: d.b}
	var at span
	err = jsonPath(&s, path, path, 0, &at, &found)
	if err == nil {
		err = s.End()
	}
	_, badKey := err.(*jsonKeyError) // returned as it is, never wrapped
	switch {
	case badKey:
		return nil, false, err
	case err != nil:
		d.notJSON = true
		if d.form != formNone {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("body is not valid JSON: %w", err)
	case !found:
		return nil, false, nil
	}
	return d.b[at.start:at.end], true, nil
}

// jsonPath scans the value at s.I, which is at the path full less rest:
// the value at the end of the path is at, and found is set.
func jsonPath(s *jsonscan.Scanner, full, rest string, depth int, at *span, found *bool) error {
	if rest == "" {
		st, en, err := s.Value(depth)
		*at, *found = span{st, en}, true
		return err
	}
	part, next, _ := strings.Cut(rest, ".")
	switch s.Peek() {
	case '{':
		seen := false
		return s.Object(depth+1, func(ks, ke int, esc bool) error {
			key := s.KeyBytes(ks, ke, esc)
			switch {
			case string(key) == part:
				if seen {
					return &jsonKeyError{fmt.Sprintf("json field %s: %s appears twice", full, part)}
				}
				seen = true
				return jsonPath(s, full, next, depth+1, at, found)
			case bytes.EqualFold(key, []byte(part)):
				return &jsonKeyError{fmt.Sprintf("json field %s: %s is spelled %q; priced fields must be spelled exactly", full, part, key)}
			}
			_, _, err := s.Value(depth + 1)
			return err
		})
	case '[':
		want, err := strconv.Atoi(part)
		if err != nil {
			want = -1
		}
		i := 0
		return s.Array(depth+1, func() error {
			i++
			if i-1 == want {
				return jsonPath(s, full, next, depth+1, at, found)
			}
			_, _, err := s.Value(depth + 1)
			return err
		})
	}
	_, _, err := s.Value(depth)
	return err
}

// countRaw reads a JSON value as a count: a non-negative integer number
// (or a string holding one), the number of elements of an array or
// members of an object, 1 for true, 0 for false. ok is false for null.
//
// An array that is not a list (list false: a field named as a count) is
// also read as a JavaScript server reads it as a number: Number and
// parseInt read [1000], ["1000"] and [[1000]] as 1000 (they read the
// array's text, its elements joined by commas), where its elements are
// one; of the two readings, the larger counts (see arrayNumber).
func countRaw(raw []byte, list bool) (n int64, ok bool, err error) {
	switch raw[0] {
	case 'n':
		return 0, false, nil
	case 't':
		return 1, true, nil
	case 'f':
		return 0, true, nil
	case '"':
		v, err := stringRaw(raw)
		if err != nil {
			return 0, false, err
		}
		n, err = parseCount(v)
		return n, err == nil, err
	case '[', '{':
		s := jsonscan.Scanner{B: raw}
		if raw[0] == '[' {
			err = s.Array(1, func() error {
				n++
				_, _, err := s.Value(1)
				return err
			})
			if err == nil && !list {
				if v, ok := arrayNumber(raw, 1); ok {
					n = max(n, v)
				}
			}
		} else {
			err = s.Object(1, func(int, int, bool) error {
				n++
				_, _, err := s.Value(1)
				return err
			})
		}
		return n, err == nil, err
	}
	n, err = parseCount(string(raw))
	return n, err == nil, err
}

// arrayNumber reads the valid JSON array raw as parseInt reads it as a
// number: by the leading number of its text, which its first element's
// text begins (a nested array's, its own first element's). That is a
// number's value (its fraction rounded up, as parseCount does) or a
// string's leading count: the whole string when parseCount reads it
// ("1e3" is 1000 to Number), else its leading digits after spaces and a
// '+' ("1000 results" is 1000 to parseInt), in hexadecimal after "0x"
// as parseInt reads them. ok is false when the text begins with no
// count: an empty array, another kind of element, a negative number.
func arrayNumber(raw []byte, depth int) (n int64, ok bool) {
	s := jsonscan.Scanner{B: raw, I: 1}
	if s.Space(); s.Peek() == ']' {
		return 0, false
	}
	start, end, err := s.Value(depth)
	if err != nil {
		return 0, false
	}
	first := raw[start:end]
	switch c := first[0]; {
	case c == '[':
		return arrayNumber(first, depth+1)
	case c == '"':
		v, err := stringRaw(first)
		if err != nil {
			return 0, false
		}
		return leadingCount(v)
	case c == '-' || '0' <= c && c <= '9':
		n, err := parseCount(string(first))
		return n, err == nil
	}
	return 0, false
}

// leadingCount reads the count a string begins with, as Number reads the
// whole of it (parseCount) or, failing that, as parseInt reads its
// beginning: spaces, a '+', then decimal digits, or hexadecimal ones
// after "0x"; it saturates at math.MaxInt64.
func leadingCount(v string) (int64, bool) {
	if n, err := parseCount(v); err == nil {
		return n, true
	}
	v = strings.TrimLeft(v, " \t\n\r\f\v")
	v = strings.TrimPrefix(v, "+")
	base := int64(10)
	if len(v) > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X') {
		base, v = 16, v[2:]
	}
	var n int64
	i := 0
	for ; i < len(v); i++ {
		d := int64(digitValue(v[i]))
		if d >= base {
			break
		}
		if n > (math.MaxInt64-d)/base {
			n = math.MaxInt64
			continue
		}
		n = n*base + d
	}
	return n, i > 0
}

// digitValue is c's value as a hexadecimal digit, or 16 when c is none.
func digitValue(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10
	}
	return 16
}

// stringRaw decodes a JSON string.
func stringRaw(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	err := json.Unmarshal(raw, &v)
	return v, err
}

// namedValue returns the value of name in m, a query's parameters or a
// header, in any of its spellings (is: ParamIs for a query, HeaderIs for
// a header), and how many values they hold.
func namedValue(m map[string][]string, name string, is func(name, want string) bool) (v string, n int) {
	for k, vs := range m {
		if is(k, name) {
			if len(vs) > 0 && n == 0 {
				v = vs[0]
			}
			n += len(vs)
		}
	}
	return v, n
}

// maxFormValue bounds the value of a multipart form field that a rule
// reads.
const maxFormValue = 4 << 10

// formFields calls fn with each field of a form body, its name and value
// decoded; a urlencoded body's fields are separated by '&' or ';' (which
// some servers take as '&'). It does nothing for a body that is not a
// form. A multipart body that cannot be read is an error, and so is a
// body of two Content-Types.
func (d *reqBody) formFields(fn func(key, value string) error) error {
	if d.typeErr != nil {
		return d.typeErr
	}
	switch d.form {
	case formURLEncoded:
		for k, v := range FormPairs(string(d.b)) {
			if err := fn(k, v); err != nil {
				return err
			}
		}
	case formMultipart:
		_, params, err := mime.ParseMediaType(d.ct)
		if err != nil || params["boundary"] == "" {
			return fmt.Errorf("multipart body: no boundary in its Content-Type")
		}
		mr := multipart.NewReader(bytes.NewReader(d.b), params["boundary"])
		for {
			// Raw: NextPart would decode a quoted-printable part, which
			// not every server does.
			p, err := mr.NextRawPart()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("multipart body: %w", err)
			}
			if err := identityPart(p); err != nil {
				return fmt.Errorf("multipart body: %w", err)
			}
			name, err := PartName(p)
			if err != nil {
				return fmt.Errorf("multipart body: %w", err)
			}
			if p.FileName() != "" || name == "" {
				continue // a file is not a field
			}
			b, err := io.ReadAll(io.LimitReader(p, maxFormValue+1))
			if err != nil {
				return fmt.Errorf("multipart body: %w", err)
			}
			if len(b) > maxFormValue {
				return fmt.Errorf("multipart body: field %s: longer than %d bytes", name, maxFormValue)
			}
			if err := fn(name, string(b)); err != nil {
				return err
			}
		}
	}
	return nil
}

// identityPart is an error for a part p whose Content-Transfer-Encoding
// is not the identity (7bit, 8bit, binary): servers differ in what they
// decode (python-multipart base64 and quoted-printable, Go's multipart
// reader quoted-printable alone, Werkzeug neither), so that one reads a
// field's value as sent and another the value it encodes. RFC 7578 has
// form data sent without it.
func identityPart(p *multipart.Part) error {
	vs := p.Header.Values("Content-Transfer-Encoding")
	for _, v := range vs {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "7bit", "8bit", "binary":
		default:
			return fmt.Errorf("a part's Content-Transfer-Encoding %q: servers differ in how they decode it; send the field as it is", v)
		}
	}
	if len(vs) > 1 {
		return fmt.Errorf("a part gives its Content-Transfer-Encoding %d times", len(vs))
	}
	return nil
}

// PartName returns the name of the form field that the part p of a
// multipart body is to a server: the name parameter of its
// Content-Disposition, whatever the disposition's type ("" when it has
// none). Go's Part.FormName names a form-data part alone, but Werkzeug
// (Flask) and python-multipart (Starlette, FastAPI) take the name
// of an "attachment" or an "inline" part too. A Content-Disposition given
// twice, or that does not parse (a parameter given twice, one without a
// value), is an error: lenient parsers still read a name from it, each
// its own.
func PartName(p *multipart.Part) (string, error) {
	vs := p.Header.Values("Content-Disposition")
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("a part gives its Content-Disposition %d times", len(vs))
	}
	_, params, err := mime.ParseMediaType(vs[0])
	if err != nil {
		return "", fmt.Errorf("a part's Content-Disposition %q: %w", vs[0], err)
	}
	return params["name"], nil
}

// FormPairs yields the name and value of each pair of a urlencoded form or
// query, decoded, separated by '&' or ';' (which some servers take as '&':
// Rack before 3, Python's parse_qs before 3.9.2, Perl's CGI); a pair
// whose escapes are not valid is yielded as it is.
func FormPairs(raw string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		rest := raw
		for rest != "" {
			i := strings.IndexAny(rest, "&;")
			pair := rest
			if i >= 0 {
				pair, rest = rest[:i], rest[i+1:]
			} else {
				rest = ""
			}
			if pair == "" {
				continue
			}
			k, v, _ := strings.Cut(pair, "=")
			if !yield(formUnescape(k), formUnescape(v)) {
				return
			}
		}
	}
}

// formUnescape decodes a urlencoded form's name or value; one that is not
// validly escaped is taken as it is.
func formUnescape(s string) string {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// formValue returns the value of the form field named name (formKeyIs),
// and how many values its spellings hold.
func (d *reqBody) formValue(name string) (v string, n int, err error) {
	err = d.formFields(func(key, value string) error {
		if formKeyIs(key, name) {
			if n == 0 {
				v = value
			}
			n++
		}
		return nil
	})
	return v, n, err
}
