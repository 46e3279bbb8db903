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
type UsageTap struct {
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
		if t.depth == 1 && t.expectKey {
			t.inKey, t.key, t.keyLong = true, t.key[:0], false
		}
	case '{', '[':
		if t.depth == 0 && c != '{' {
			t.broken = true
		}
		t.depth++
		if t.depth == 1 {
			t.expectKey = true
		}
	case '}', ']':
		t.depth--
		if t.depth == 0 && t.taking {
			t.end(1) // the object's '}' is not the value's
		}
	case ':':
		if t.depth == 1 {
			t.expectKey = false
			if !t.keyLong && t.isUsage() {
				t.taking, t.cur = true, t.cur[:0]
			}
		}
	case ',':
		if t.depth == 1 {
			if t.taking {
				t.end(1)
			}
			t.expectKey = true
		}
	}
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

func (t *UsageTap) isUsage() bool {
	name := t.key
	if bytes.IndexByte(name, '\\') >= 0 {
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, name...), '"'), &s) != nil {
			return false
		}
		name = []byte(s)
	}
	return len(name) >= len("usage") && bytes.EqualFold(name, []byte("usage"))
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
