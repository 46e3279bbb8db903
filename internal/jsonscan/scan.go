// Package jsonscan is a small, strict JSON scanner for the hot paths: one
// validating pass over a text that hands back byte spans, so that callers
// decode only what they need and skip the rest without encoding/json's
// second scan and reflection.
//
// It accepts exactly RFC 8259 JSON, what encoding/json accepts (the
// fuzz tests of its callers in costmodel and proxy hold them to it), but
// nesting deeper than the Scanner's MaxDepth. Invalid UTF-8 inside strings
// is accepted, as encoding/json accepts it (and replaces it with U+FFFD
// when decoding): a caller that decodes a string itself must hand one with
// a byte beyond ASCII to encoding/json. Strings are skipped eight bytes at
// a time while they hold no quote, backslash or control character.
package jsonscan

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
)

// Scanner reads JSON from B at I. Its zero value refuses nothing deeper
// than DefaultMaxDepth; a Scanner is used by one goroutine at a time.
type Scanner struct {
	B []byte
	I int
	// MaxDepth is the deepest nesting of objects and arrays accepted; 0
	// means DefaultMaxDepth.
	MaxDepth int
}

// DefaultMaxDepth is the nesting a Scanner accepts when its MaxDepth is 0.
// encoding/json accepts 10,000.
const DefaultMaxDepth = 1000

// SyntaxError is a reason a text is not JSON and where it was found.
type SyntaxError struct {
	Msg string
	Off int // a byte offset
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.Msg, e.Off)
}

func (s *Scanner) Fail(msg string) error {
	return &SyntaxError{Msg: msg, Off: s.I}
}

func (s *Scanner) Space() {
	for s.I < len(s.B) {
		switch s.B[s.I] {
		case ' ', '\t', '\n', '\r':
			s.I++
		default:
			return
		}
	}
}

// Peek returns the next non-space byte, or 0 at the end.
func (s *Scanner) Peek() byte {
	s.Space()
	if s.I < len(s.B) {
		return s.B[s.I]
	}
	return 0
}

const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// Str reads a string at s.I (which is '"'); it returns the content span
// (without quotes) and whether it holds escapes.
func (s *Scanner) Str() (start, end int, escaped bool, err error) {
	s.I++ // opening quote
	start = s.I
	b := s.B
	for {
		// Eight bytes at a time while none is '"', '\\' or below 0x20.
		for s.I+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[s.I:])
			q := x ^ (lo8 * '"')
			bs := x ^ (lo8 * '\\')
			t := (((q - lo8) &^ q) | ((bs - lo8) &^ bs) | ((x - lo8*0x20) &^ x)) & hi8
			if t != 0 {
				// The lowest flagged byte is a real hit: a borrow only
				// flags bytes above the one that caused it.
				s.I += bits.TrailingZeros64(t) / 8
				break
			}
			s.I += 8
		}
		if s.I >= len(b) {
			return 0, 0, false, s.Fail("unterminated string")
		}
		c := b[s.I]
		switch {
		case c == '"':
			end = s.I
			s.I++
			return start, end, escaped, nil
		case c == '\\':
			escaped = true
			if s.I+1 >= len(b) {
				return 0, 0, false, s.Fail("unterminated string")
			}
			switch b[s.I+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.I += 2
			case 'u':
				if s.I+6 > len(b) {
					return 0, 0, false, s.Fail("bad \\u escape")
				}
				for _, h := range b[s.I+2 : s.I+6] {
					if !IsHex(h) {
						return 0, 0, false, s.Fail("bad \\u escape")
					}
				}
				s.I += 6
			default:
				return 0, 0, false, s.Fail("bad escape")
			}
		case c < 0x20:
			return 0, 0, false, s.Fail("control character in string")
		default:
			s.I++
		}
	}
}

func IsHex(c byte) bool {
	return c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f'
}

func IsDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *Scanner) Number() error {
	b := s.B
	if s.I < len(b) && b[s.I] == '-' {
		s.I++
	}
	switch {
	case s.I < len(b) && b[s.I] == '0':
		s.I++
	case s.I < len(b) && b[s.I] >= '1' && b[s.I] <= '9':
		for s.I < len(b) && IsDigit(b[s.I]) {
			s.I++
		}
	default:
		return s.Fail("bad number")
	}
	if s.I < len(b) && b[s.I] == '.' {
		s.I++
		if s.I >= len(b) || !IsDigit(b[s.I]) {
			return s.Fail("bad number")
		}
		for s.I < len(b) && IsDigit(b[s.I]) {
			s.I++
		}
	}
	if s.I < len(b) && (b[s.I] == 'e' || b[s.I] == 'E') {
		s.I++
		if s.I < len(b) && (b[s.I] == '+' || b[s.I] == '-') {
			s.I++
		}
		if s.I >= len(b) || !IsDigit(b[s.I]) {
			return s.Fail("bad number")
		}
		for s.I < len(b) && IsDigit(b[s.I]) {
			s.I++
		}
	}
	return nil
}

func (s *Scanner) Literal(lit string) error {
	if len(s.B)-s.I < len(lit) || string(s.B[s.I:s.I+len(lit)]) != lit {
		return s.Fail("invalid character")
	}
	s.I += len(lit)
	return nil
}

// Value skips one value, validating it, and returns its span.
func (s *Scanner) Value(depth int) (start, end int, err error) {
	c := s.Peek()
	start = s.I
	switch {
	case c == '"':
		_, _, _, err = s.Str()
	case c == '{':
		err = s.Object(depth+1, func(int, int, bool) error {
			_, _, err := s.Value(depth + 1)
			return err
		})
	case c == '[':
		err = s.Array(depth+1, func() error {
			_, _, err := s.Value(depth + 1)
			return err
		})
	case c == '-' || IsDigit(c):
		err = s.Number()
	case c == 't':
		err = s.Literal("true")
	case c == 'f':
		err = s.Literal("false")
	case c == 'n':
		err = s.Literal("null")
	case c == 0:
		err = s.Fail("unexpected end of JSON")
	default:
		err = s.Fail(fmt.Sprintf("invalid character %q", c))
	}
	return start, s.I, err
}

// Object reads an object at s.I; for each member it calls member with the
// key's span, leaving s.I at the value, which member must consume.
func (s *Scanner) Object(depth int, member func(kstart, kend int, kescaped bool) error) error {
	if depth > s.maxDepth() {
		return s.Fail("nested too deeply")
	}
	s.I++ // '{'
	if s.Peek() == '}' {
		s.I++
		return nil
	}
	for {
		if s.Peek() != '"' {
			return s.Fail("want an object key")
		}
		ks, ke, kesc, err := s.Str()
		if err != nil {
			return err
		}
		if s.Peek() != ':' {
			return s.Fail("want ':' after object key")
		}
		s.I++
		if err := member(ks, ke, kesc); err != nil {
			return err
		}
		switch s.Peek() {
		case ',':
			s.I++
		case '}':
			s.I++
			return nil
		default:
			return s.Fail("want ',' or '}' in object")
		}
	}
}

// Array reads an array at s.I, calling elem with s.I at each element, which
// elem must consume.
func (s *Scanner) Array(depth int, elem func() error) error {
	if depth > s.maxDepth() {
		return s.Fail("nested too deeply")
	}
	s.I++ // '['
	if s.Peek() == ']' {
		s.I++
		return nil
	}
	for {
		s.Space()
		if err := elem(); err != nil {
			return err
		}
		switch s.Peek() {
		case ',':
			s.I++
		case ']':
			s.I++
			return nil
		default:
			return s.Fail("want ',' or ']' in array")
		}
	}
}

// End checks that nothing but space follows the top-level value.
func (s *Scanner) End() error {
	if s.Space(); s.I < len(s.B) {
		return s.Fail("data after the top-level value")
	}
	return nil
}

// KeyBytes returns an object key's text as bytes: the key's own bytes in
// s.B when it holds no escape (no allocation), else its unescaped copy.
func (s *Scanner) KeyBytes(ks, ke int, escaped bool) []byte {
	if !escaped {
		return s.B[ks:ke]
	}
	return []byte(s.Key(ks, ke, true))
}

// Key returns an object key's text.
func (s *Scanner) Key(ks, ke int, escaped bool) string {
	if !escaped {
		return string(s.B[ks:ke])
	}
	var k string
	_ = json.Unmarshal(s.B[ks-1:ke+1], &k) // validated already
	return k
}

func (s *Scanner) maxDepth() int {
	if s.MaxDepth > 0 {
		return s.MaxDepth
	}
	return DefaultMaxDepth
}
