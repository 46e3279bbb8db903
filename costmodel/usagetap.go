package costmodel

import (
	"bytes"
	"encoding/json"
)

// maxTapValue bounds the usage member a UsageTap keeps.
const maxTapValue = 64 << 10

// UsageTap reads the usage report of a JSON answer that is passed on in
// pieces and too large to keep whole (the proxy keeps 8 MiB of an
// answer): it follows the document's nesting byte by byte and keeps only
// its top-level members named "usage" (in any case), which APIs write
// after the output. Write it every byte of the answer from its start;
// read Usage at the end. The zero value is ready to use; it is not safe
// for concurrent use.
//
// A tap made by the stream meter for an over-long Responses event reads
// instead the "usage" member of the event's top-level "response" object
// (under): the event is as long as the instructions and tools it echoes.
type UsageTap struct {
	under     string // when set, the usage is read in the object of the top-level member of this name
	pending   bool   // under is set and the top-level member being read is its
	inUnder   bool   // inside that object, at depth 2
	depth     int
	inStr     bool
	esc       bool
	expectKey bool   // at depth 1, the next string is a member's name
	inKey     bool   // reading a top-level member's name
	key       []byte // that name, raw, up to 32 bytes
	keyLong   bool
	taking    bool     // inside the value of a top-level usage member
	cur       []byte   // that value so far
	values    [][]byte // the usage member's value, whole; none after a second one
	broken    bool     // a value passed maxTapValue, or the document is not an object
}

// Write consumes the next bytes of the answer. It never fails.
func (t *UsageTap) Write(p []byte) (int, error) {
	for _, c := range p {
		t.step(c)
	}
	return len(p), nil
}

func (t *UsageTap) step(c byte) {
	if t.taking {
		if len(t.cur) >= maxTapValue {
			t.broken, t.taking = true, false
		} else {
			t.cur = append(t.cur, c)
		}
	}
	if t.inStr {
		switch {
		case t.esc:
			t.esc = false
		case c == '\\':
			t.esc = true
		case c == '"':
			t.inStr = false
			if t.inKey {
				t.inKey = false
				return
			}
		}
		if t.inKey {
			if len(t.key) < 32 {
				t.key = append(t.key, c)
			} else {
				t.keyLong = true
			}
		}
		return
	}
	switch c {
	case '"':
		t.inStr = true
		if t.keyed() && t.expectKey {
			t.inKey, t.key, t.keyLong = true, t.key[:0], false
		}
	case '{', '[':
		if t.depth == 0 && c != '{' {
			t.broken = true
		}
		t.depth++
		switch {
		case t.depth == 1:
			t.expectKey = true
		case t.depth == 2 && t.pending && c == '{':
			t.inUnder, t.expectKey = true, true
		}
		t.pending = false
	case '}', ']':
		t.depth--
		if t.depth == t.level()-1 && t.taking {
			t.end(1) // the object's '}' is not the value's
		}
		if t.depth == 1 && t.inUnder {
			t.inUnder = false
		}
	case ':':
		if t.keyed() {
			t.expectKey = false
			switch {
			case t.keyLong:
			case t.under != "" && t.depth == 1:
				t.pending = t.isName(t.under)
			case t.isName("usage"):
				t.taking, t.cur = true, t.cur[:0]
			}
		}
	case ',':
		if t.keyed() {
			if t.taking && t.depth == t.level() {
				t.end(1)
			}
			t.expectKey = true
			t.pending = false
		}
	}
}

// level is the depth of the object whose usage member the tap reads.
func (t *UsageTap) level() int {
	if t.under != "" {
		return 2
	}
	return 1
}

// keyed tells whether the tap is at a depth whose member names it reads:
// the top level, and the object under names.
func (t *UsageTap) keyed() bool {
	return t.depth == 1 || t.depth == 2 && t.inUnder
}

// end closes the value being taken, less its last n bytes (the ',' or
// '}' that ended it).
func (t *UsageTap) end(n int) {
	t.taking = false
	if len(t.values) > 0 {
		// A second usage member: ambiguous, and none is kept, so that an
		// answer of many holds no more than one value's bound.
		t.broken, t.values = true, nil
		return
	}
	if len(t.cur) >= n {
		t.values = append(t.values, bytes.TrimSpace(append([]byte(nil), t.cur[:len(t.cur)-n]...)))
	}
}

// isName tells whether the member name just read is want, in any case, as
// encoding/json matches it.
func (t *UsageTap) isName(want string) bool {
	name := t.key
	if bytes.IndexByte(name, '\\') >= 0 {
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, name...), '"'), &s) != nil {
			return false
		}
		name = []byte(s)
	}
	return named(name, want)
}

// Usage is the usage the answer reported, read as ParseUsage reads it,
// and whether it reported one that can be read: exactly one usage member
// (two are ambiguous), of a size the tap kept.
func (t *UsageTap) Usage(kind Kind) (Usage, bool) {
	if t.broken || len(t.values) != 1 {
		return Usage{}, false
	}
	doc := append(append([]byte(`{"usage":`), t.values[0]...), '}')
	u, err := ParseUsage(kind, doc)
	return u, err == nil
}
