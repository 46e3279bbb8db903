package gate

// What a ledger entry records of the client address and the custom
// attributes its request's limits were keyed by, and how a restore keys a
// counter by them again. An entry keeps each value as the limit's key
// wrote it (writeKeyValue: escaped, a long one hashed), so that the
// restored key is the debited key byte for byte, whatever the value; the
// ledger takes only UTF-8 text without NUL, so a byte of the written
// value that is not is kept as %XX (ledgerText), which no written value
// holds otherwise: writeKeyValue writes a '%' only in %25, %3A, %3D,
// %7B, %7D and %~, and %00 and %80 to %FF are none of them.

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/ledger"
)

// keyDims are the client address and the attributes some limit of a
// configuration is keyed by, which its requests' entries record (see
// Reservation.keyedBy). The zero value records none.
type keyDims struct {
	ip    bool
	attrs []string // sorted, each once
}

// keyDimsOf is the keyDims of limits.
func keyDimsOf(limits []*compiledLimit) keyDims {
	var k keyDims
	for _, l := range limits {
		k.ip = k.ip || l.byIP
		k.attrs = append(k.attrs, l.attrs...)
	}
	slices.Sort(k.attrs)
	k.attrs = slices.Compact(k.attrs)
	return k
}

// record is what an entry of req records of the address and attributes
// of k (see ledger.Entry.KeyIP, KeyAttrs). It allocates nothing when k is
// empty or req has none of them.
func (k *keyDims) record(req *Request) (keyIP, keyAttrs string) {
	if k.ip && req.IP != "" {
		keyIP = ledgerText(writtenValue(ipKey(req.IP)))
	}
	if len(k.attrs) == 0 || len(req.Attributes) == 0 {
		return keyIP, ""
	}
	var b strings.Builder
	for _, name := range k.attrs {
		v := req.Attributes[name]
		if v == "" {
			continue // no limit is keyed by it (see keyedFor)
		}
		v = ledgerText(writtenValue(v))
		if b.Len()+1+len(name)+1+len(v) > ledger.MaxKeyAttrs {
			// The entry is kept; the limits keyed by this attribute do not
			// count it after a loss. Sixteen attributes of a kilobyte fit.
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(':')
		} else {
			b.Grow(64) // the usual pairs in one allocation
		}
		b.WriteString(name)
		b.WriteByte('=')
		b.WriteString(v)
	}
	return keyIP, b.String()
}

// writtenValue is v as a limit's key writes it (see writeKeyValue): v
// itself, not a copy, when it writes v as it is.
func writtenValue(v string) string {
	if plainKeyValue(v) {
		return v
	}
	var b strings.Builder
	writeKeyValue(&b, v)
	return b.String()
}

// ledgerText is written, a value as a key writes it, as the ledger can
// store it: each byte that is not part of UTF-8 text, and NUL, as %XX.
func ledgerText(written string) string {
	if utf8.ValidString(written) && strings.IndexByte(written, 0) < 0 {
		return written
	}
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(written); {
		r, n := utf8.DecodeRuneInString(written[i:])
		if r == utf8.RuneError && n <= 1 || r == 0 {
			c := written[i]
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			i++
			continue
		}
		b.WriteString(written[i : i+n])
		i += n
	}
	return b.String()
}

// keyText is the written value that ledgerText wrote as s.
func keyText(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	unhex := func(c byte) (byte, bool) {
		switch {
		case '0' <= c && c <= '9':
			return c - '0', true
		case 'A' <= c && c <= 'F':
			return c - 'A' + 10, true
		}
		return 0, false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if c := hi<<4 | lo; ok1 && ok2 && (c == 0 || c >= 0x80) {
				b.WriteByte(c)
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// writtenDims is what a restore keys a counter by for the dimensions an
// entry records as its limits' keys wrote them (see Reservation.written).
type writtenDims struct {
	ip    string
	attrs map[string]string // by attribute name, without the prefix
}

// of is d's written value; false for a dimension it does not hold.
func (w *writtenDims) of(d string) (string, bool) {
	if d == "ip" {
		return w.ip, w.ip != ""
	}
	if name, ok := strings.CutPrefix(d, config.AttributePrefix); ok {
		v, ok := w.attrs[name]
		return v, ok
	}
	return "", false
}

// writtenOf is what group gr of the ledger's entries recorded of the
// address and the attributes limit l is keyed by, as its key wrote them;
// false when gr's entries were not keyed by one of them (the request had
// none, or the entry was stored before the ledger kept them).
func writtenOf(l *compiledLimit, gr *ledger.Group) (*writtenDims, bool) {
	if !l.byIP && len(l.attrs) == 0 {
		return nil, true
	}
	w := &writtenDims{}
	if l.byIP {
		if gr.KeyIP == "" {
			return nil, false
		}
		w.ip = keyText(gr.KeyIP)
	}
	if len(l.attrs) == 0 {
		return w, true
	}
	w.attrs = make(map[string]string, len(l.attrs))
	for pair := range strings.SplitSeq(gr.KeyAttrs, ":") {
		name, v, ok := strings.Cut(pair, "=")
		if ok && slices.Contains(l.attrs, name) {
			w.attrs[name] = keyText(v)
		}
	}
	return w, len(w.attrs) == len(l.attrs)
}
