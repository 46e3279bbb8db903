package costmodel

// Parts of a request that costgate cannot count exactly.
//
// Documents, audio, and images whose size is not in the request carry
// tokens that only the provider can count. An estimate reserves an upper
// bound for them and sets Estimate.Uncounted:
//
//   - a document (a PDF or other file part, an Anthropic document block
//     that is not plain text) costs one token per two bytes of the file as
//     decoded from base64, at least docMinTokens (3,000: a page's text and
//     its page image) and at most docMaxTokens (300,000: 100 pages, the
//     providers' page limit, of 3,000). A document whose bytes are not in the
//     request (a file id, a URL) costs docMaxTokens;
//   - audio input costs at most 20 tokens per second (about twice what the
//     providers bill), and a second takes at least 8,000 bytes of WAV
//     (8 kHz, 8-bit, mono) or 1,000 bytes of any compressed format (8
//     kbit/s): one token per 400 bytes of WAV, per 50 of anything else. Its
//     tokens are Usage.AudioInputTokens, priced at the audio rate;
//   - an image whose size is not in the request is counted at the largest
//     its rule allows (images.go, anthropic.go);
//   - an item, a part or a block of a kind costgate does not read (a hosted
//     tool's call or output, a kind newer than this code) is counted as
//     the text of its JSON, keys and punctuation included (opaqueTokens):
//     whatever the upstream renders of it, text hidden there counts at
//     least as much as in a message.
//
// Messages' members are decoded with encoding/json, which matches keys
// case-insensitively; a member that appears twice in any spelling (in the
// message, its content parts and their priced objects) is refused, so that
// decoders that keep the first, the last or the exactly-spelled one all
// read what costgate counted.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode"

	"github.com/costgate/costgate/internal/jsonscan"
)

const (
	docMinTokens      = 3000
	docMaxTokens      = 300_000
	audioBytesWAV     = 400
	audioBytesOther   = 50
	maxCheckedKeysLin = 16 // objects with more keys are checked with a map
)

// documentTokens returns the tokens reserved for a document of the given
// base64 data (or data: URL); known is false when there is none.
func documentTokens(data string) int64 {
	if _, after, ok := strings.Cut(data, ";base64,"); ok && strings.HasPrefix(data, "data:") {
		data = after
	}
	if data == "" {
		return docMaxTokens
	}
	size := int64(base64.StdEncoding.DecodedLen(len(data)))
	return min(max(mulDivCeil(size, 1, 2), docMinTokens), docMaxTokens)
}

// opaqueTokens returns the tokens of raw, a JSON value costgate does not
// read, counted as text: its JSON text whole, keys, punctuation and escapes
// included, an upper bound of the text an upstream renders of it. The
// members of a top-level object that skip names (in any spelling) are left
// out: what is not text and is counted apart (an image), or is sealed by
// the upstream (encrypted reasoning). It allocates a copy of raw.
func opaqueTokens(m model, raw []byte, skip ...string) int64 {
	raw = bytes.TrimSpace(raw)
	if len(skip) == 0 || len(raw) == 0 || raw[0] != '{' {
		return m.countText(string(raw))
	}
	s := jsonscan.Scanner{B: raw}
	kept := make([]byte, 0, len(raw))
	from := 0
	err := s.Object(1, func(ks, ke int, esc bool) error {
		k := s.Key(ks, ke, esc)
		_, end, err := s.Value(1)
		for _, name := range skip {
			if strings.EqualFold(k, name) {
				kept = append(kept, raw[from:ks-1]...) // up to the key's quote
				from = end
			}
		}
		return err
	})
	if err != nil {
		return m.countText(string(raw))
	}
	kept = append(kept, raw[from:]...)
	return m.countText(string(kept))
}

// opaqueParts counts, with opaqueTokens (leaving out the members skip
// names), the elements of raw, a JSON array, at the given indices
// (ascending): the parts or blocks of a content that costgate does not
// read. Each marks the count Uncounted.
func opaqueParts(m model, raw []byte, indices []int, skip ...string) (tokenCount, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return tokenCount{}, err
	}
	var c tokenCount
	for _, i := range indices {
		if i < len(elems) {
			c.add(tokenCount{n: opaqueTokens(m, elems[i], skip...), uncounted: true})
		}
	}
	return c, nil
}

// audioTokens returns the tokens reserved for base64 audio data of the
// given format ("wav", "mp3", ...).
func audioTokens(data, format string) int64 {
	size := int64(base64.StdEncoding.DecodedLen(len(data)))
	if strings.EqualFold(format, "wav") {
		return mulDivCeil(size, 1, audioBytesWAV)
	}
	return mulDivCeil(size, 1, audioBytesOther)
}

// checkedContainers are the members of a message or a tool whose objects (or arrays
// of objects) costgate reads, so their keys are checked too. Tool inputs
// and schemas are not: they are the client's own JSON, where "Name" and
// "name" may both belong.
func checkedContainer(key string) bool {
	switch key {
	case "content", "image_url", "input_audio", "file", "source", "tool_calls", "function", "function_call", "output", "custom", "audio",
		"container", "environment": // a Responses tool's container, which is priced
		return true
	}
	return false
}

// checkMembers reports a key of the object raw, or of the objects of its
// checked members, that appears twice in any spelling encoding/json folds
// together.
func checkMembers(raw []byte) error {
	s := jsonScanner{jsonscan.Scanner{B: raw}}
	return s.checkValue(1, "")
}

func (s *jsonScanner) checkValue(depth int, path string) error {
	switch s.Peek() {
	case '{':
		return s.checkObject(depth, path)
	case '[':
		i := 0
		return s.Array(depth+1, func() error {
			err := s.checkValue(depth+1, path+"["+itoa(i)+"]")
			i++
			return err
		})
	}
	_, _, err := s.Value(depth)
	return err
}

func (s *jsonScanner) checkObject(depth int, path string) error {
	var (
		buf  [maxCheckedKeysLin]string
		seen = buf[:0]
		many map[string]string
	)
	return s.Object(depth+1, func(ks, ke int, esc bool) error {
		k := s.Key(ks, ke, esc)
		dup := ""
		if many != nil {
			f := foldKey(k)
			if d, ok := many[f]; ok {
				dup = d
			} else {
				many[f] = k
			}
		} else {
			for _, o := range seen {
				if strings.EqualFold(o, k) {
					dup = o
					break
				}
			}
			if dup == "" {
				if len(seen) < cap(seen) {
					seen = append(seen, k)
				} else {
					many = make(map[string]string, 2*len(seen))
					for _, o := range seen {
						many[foldKey(o)] = o
					}
					many[foldKey(k)] = k
				}
			}
		}
		if dup != "" {
			if dup == k {
				return wrongType("%s%q appears twice", dotted(path), k)
			}
			return wrongType("%s%q appears twice, also as %q", dotted(path), dup, k)
		}
		if checkedContainer(k) {
			return s.checkValue(depth+1, dotted(path)+k)
		}
		_, _, err := s.Value(depth + 1)
		return err
	})
}

func dotted(path string) string {
	if path == "" {
		return ""
	}
	return path + "."
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// foldKey maps s to a key that two strings share exactly when
// strings.EqualFold holds for them: each rune becomes the smallest rune of
// its case-folding orbit.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		f := r
		for x := unicode.SimpleFold(r); x != r; x = unicode.SimpleFold(x) {
			f = min(f, x)
		}
		b.WriteRune(f)
	}
	return b.String()
}
