package costmodel

// How servers match the names a rule reads: a header, a query parameter or
// a form field spelled otherwise than the rule spells it is the same one
// to some upstream, so costgate reads every such spelling (and refuses a
// request that gives one twice). JSON keys are matched in fields.go.

import (
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

// HeaderIs tells whether the header names name and want are one header to
// a server: in any case, and with '_' for '-' (servers that read headers
// by their CGI names, HTTP_X_CREDITS, take X_Credits for X-Credits). It
// does not allocate.
func HeaderIs(name, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i := range len(name) {
		if headerFold(name[i]) != headerFold(want[i]) {
			return false
		}
	}
	return true
}

// ContentCodings returns the content codings other than identity that h
// declares a body in, in order, in every Content-Encoding field of any
// spelling a server reads as one (HeaderIs: Content_Encoding is
// HTTP_CONTENT_ENCODING too); nil for none. A body in a coding is read by
// a server that decodes it as the decoded body, which its coded bytes do
// not tell.
func ContentCodings(h http.Header) []string {
	var codings []string
	for name, vs := range h {
		if !HeaderIs(name, "content-encoding") {
			continue
		}
		for _, v := range vs {
			for c := range strings.SplitSeq(v, ",") {
				if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
					codings = append(codings, c)
				}
			}
		}
	}
	return codings
}

// IsEventStream tells whether the Content-Type ct is a stream of
// server-sent events, text/event-stream in any case (a media type is
// case-insensitive), whatever its parameters.
func IsEventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

func headerFold(c byte) byte {
	switch {
	case c == '_':
		return '-'
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	}
	return c
}

// ParamIs tells whether the query parameter or form field names name and
// want are one to some server: in any case (ASP.NET's are
// case-insensitive; Unicode folding, as strings.EqualFold), with '.'
// or ' ' for '_' (PHP reads "page.size" as "page_size"), as PHP names it
// (phpName), and with array brackets after it (arrayIndex: Node's qs
// reads "num[]=1000" as num, ["1000"], which parseInt and Number read as
// 1000).
func ParamIs(name, want string) bool {
	name = phpName(name)
	n, ok := paramPrefix(name, want)
	return ok && arrayIndex(name[n:])
}

// phpName is a parameter's name as PHP registers it: its leading spaces
// dropped, cut at a NUL (PHP reads the name as a C string), so that
// " num" and "num\x00x" are num; and a "[" that no "]" closes, and every
// "[" after it, read as "_" (PHP's php_register_variable_ex), so that
// "page[size" is page_size. ('.' and ' ' are '_' to paramRuneIs.)
func phpName(name string) string {
	name = strings.TrimLeft(name, " ")
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	if i := strings.IndexByte(name, '['); i >= 0 && strings.IndexByte(name[i:], ']') < 0 {
		name = name[:i] + strings.ReplaceAll(name[i:], "[", "_")
	}
	return name
}

// arrayIndex tells whether s, what follows a parameter's name, makes it
// that parameter as an array or an element of one to some server: empty,
// or one or more of "[]" and "[N]" ("[]", "[0]", "[][]"), which Node's qs,
// PHP and Rails read as the parameter's value given in an array.
func arrayIndex(s string) bool {
	for s != "" {
		if s[0] != '[' {
			return false
		}
		i := 1
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		if i == len(s) || s[i] != ']' {
			return false
		}
		s = s[i+1:]
	}
	return true
}

// paramPrefix tells whether name starts with want as ParamIs compares
// them, and how many bytes of name that start takes.
func paramPrefix(name, want string) (int, bool) {
	i := 0
	for want != "" {
		if i >= len(name) {
			return 0, false
		}
		a, na := utf8.DecodeRuneInString(name[i:])
		b, nb := utf8.DecodeRuneInString(want)
		if !paramRuneIs(a, b) {
			return 0, false
		}
		i, want = i+na, want[nb:]
	}
	return i, true
}

func paramRuneIs(a, b rune) bool {
	if a == '.' || a == ' ' {
		a = '_'
	}
	if b == '.' || b == ' ' {
		b = '_'
	}
	if a == b {
		return true
	}
	if a < utf8.RuneSelf && b < utf8.RuneSelf {
		la, lb := a|0x20, b|0x20
		return la == lb && 'a' <= la && la <= 'z'
	}
	// The orbit of b under simple folding, as strings.EqualFold walks it.
	if a < b {
		a, b = b, a
	}
	r := unicode.SimpleFold(b)
	for r != b && r < a {
		r = unicode.SimpleFold(r)
	}
	return r == a
}

// formKeyIs tells whether the form field name key names the JSON path
// (dotted, "params.num"): spelled as the path, or in brackets
// ("params[num]", as PHP and Rails nest form fields), either followed by
// array brackets (arrayIndex).
func formKeyIs(key, path string) bool {
	if ParamIs(key, path) {
		return true
	}
	key = phpName(key)
	first := true
	for path != "" {
		var part string
		part, path, _ = strings.Cut(path, ".")
		if !first {
			if key == "" || key[0] != '[' {
				return false
			}
			key = key[1:]
		}
		n, ok := paramPrefix(key, part)
		if !ok {
			return false
		}
		key = key[n:]
		if !first {
			if key == "" || key[0] != ']' {
				return false
			}
			key = key[1:]
		}
		first = false
	}
	return arrayIndex(key)
}
