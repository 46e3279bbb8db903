package costmodel

// Pre-tokenization, by hand.
//
// Before byte-pair encoding, tiktoken splits text into pieces with a regular
// expression, and BPE then runs on each piece alone. The expressions are
//
//	cl100k_base: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//	o200k_base:  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	             [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	             \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Go libraries run them with a backtracking regular expression engine,
// which costs most of their time and allocates per match. The functions
// below implement the same leftmost-first, greedy-with-backtracking
// semantics directly: each alternative is tried in order at the current
// position, and where the engine would backtrack (the optional first
// character, U* giving characters back to Lw+, \s+ giving back its last
// character to the lookahead) the code tries the same choices in the same
// order. Character classes come from a table: one byte of flags per rune
// for the Basic Multilingual Plane, computed once from Go's unicode tables
// (the ones the regular expression engines use), and the unicode package
// beyond it. Case-insensitive contractions match as the regex engines do
// under simple case folding, so 'ſ (long s) is a contraction like 's.
//
// Input that is not valid UTF-8 is first made valid the way the regex
// engines see it: each invalid byte becomes U+FFFD.

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Rune class flags.
const (
	clsL  = 1 << iota // \p{L}
	clsN              // \p{N}
	clsS              // \s (unicode.IsSpace)
	clsNL             // \r or \n
	clsU              // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	clsW              // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
)

var (
	bmpClassOnce sync.Once
	bmpClass     []uint8 // class flags of every rune below 0x10000
)

func classOfRune(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clsL
		switch {
		case unicode.IsLower(r):
			c |= clsW
		case unicode.IsUpper(r), unicode.IsTitle(r):
			c |= clsU
		default: // Lm, Lo
			c |= clsU | clsW
		}
	} else if unicode.IsMark(r) {
		c |= clsU | clsW
	}
	if unicode.IsNumber(r) {
		c |= clsN
	}
	if unicode.IsSpace(r) {
		c |= clsS
	}
	if r == '\r' || r == '\n' {
		c |= clsNL
	}
	return c
}

func loadClasses() {
	bmpClassOnce.Do(func() {
		t := make([]uint8, 0x10000)
		for r := range t {
			t[r] = classOfRune(rune(r))
		}
		bmpClass = t
	})
}

// classAt returns the class and width of the rune at s[i].
func classAt(s string, i int) (uint8, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return bmpClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return bmpClass[r], w
	}
	return classOfRune(r), w
}

// scanWhile returns the end of the run of runes from i whose class has any
// of the bits in mask.
func scanWhile(s string, i int, mask uint8) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c&mask == 0 {
			break
		}
		i += w
	}
	return i
}

// scanPunct returns the end of the run of runes from i in
// [^\s\p{L}\p{N}].
func scanPunct(s string, i int) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c&(clsS|clsL|clsN) != 0 {
			break
		}
		i += w
	}
	return i
}

// contraction returns the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i:],
// or 0.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	switch s[i+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && s[i+2]|0x20 == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && s[i+2]|0x20 == 'l' {
			return 3
		}
	case 0xC5 | 0x20: // ſ is C5 BF
		if s[i+1] == 0xC5 && i+2 < len(s) && s[i+2] == 0xBF {
			return 3
		}
	}
	return 0
}

// whitespace matches \s*[\r\n]+|\s+(?!\S)|\s+ at s[i], whose rune is
// whitespace.
func whitespace(s string, i int) int {
	e, lastNL := i, -1
	for e < len(s) {
		c, w := classAt(s, e)
		if c&clsS == 0 {
			break
		}
		if c&clsNL != 0 {
			lastNL = e
		}
		e += w
	}
	if lastNL >= 0 {
		return lastNL + 1 // \s*[\r\n]+ (\r and \n are one byte)
	}
	if e == len(s) {
		return e // \s+(?!\S) at the end
	}
	_, w := utf8.DecodeLastRuneInString(s[i:e])
	if e-w > i {
		return e - w // \s+(?!\S): leave the last space to the next piece
	}
	return e // \s+
}

// nextCl100k returns the end of the piece that starts at s[i].
func nextCl100k(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i); n > 0 {
			return i + n
		}
	}
	c0, w0 := classAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0&clsL != 0 {
		return scanWhile(s, i+w0, clsL)
	}
	if c0&(clsL|clsN|clsNL) == 0 && i+w0 < len(s) {
		if c1, w1 := classAt(s, i+w0); c1&clsL != 0 {
			return scanWhile(s, i+w0+w1, clsL)
		}
	}
	// \p{N}{1,3}
	if c0&clsN != 0 {
		return digits(s, i+w0)
	}
	// ?[^\s\p{L}\p{N}]+[\r\n]*
	if e := punct(s, i, c0, false); e > 0 {
		return e
	}
	if c0&clsS != 0 {
		return whitespace(s, i)
	}
	return i + w0 // unreachable: every rune is a letter, number, space or other
}

func digits(s string, j int) int {
	for k := 1; k < 3 && j < len(s); k++ {
		c, w := classAt(s, j)
		if c&clsN == 0 {
			break
		}
		j += w
	}
	return j
}

// punct matches ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with slash, `[\r\n/]*`) at
// s[i], or returns 0.
func punct(s string, i int, c0 uint8, slash bool) int {
	j := i
	if s[i] == ' ' {
		if i+1 >= len(s) {
			return 0
		}
		j = i + 1
		c0, _ = classAt(s, j)
	}
	if c0&(clsS|clsL|clsN) != 0 {
		return 0
	}
	j = scanPunct(s, j)
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || slash && s[j] == '/') {
		j++
	}
	return j
}

// nextO200k returns the end of the piece that starts at s[i].
func nextO200k(s string, i int) int {
	c0, w0 := classAt(s, i)
	optional := c0&(clsL|clsN|clsNL) == 0 // [^\r\n\p{L}\p{N}] can be taken
	// [^\r\n\p{L}\p{N}]?[U]*[Lw]+(contraction)?
	if optional && i+w0 < len(s) {
		if e := o200kLower(s, i+w0); e > 0 {
			return e
		}
	}
	if e := o200kLower(s, i); e > 0 {
		return e
	}
	// [^\r\n\p{L}\p{N}]?[U]+[Lw]*(contraction)?
	if optional && i+w0 < len(s) {
		if c1, _ := classAt(s, i+w0); c1&clsU != 0 {
			return o200kUpper(s, i+w0)
		}
	}
	if c0&clsU != 0 {
		return o200kUpper(s, i)
	}
	// \p{N}{1,3}
	if c0&clsN != 0 {
		return digits(s, i+w0)
	}
	// ?[^\s\p{L}\p{N}]+[\r\n/]*
	if e := punct(s, i, c0, true); e > 0 {
		return e
	}
	if c0&clsS != 0 {
		return whitespace(s, i)
	}
	return i + w0
}

// o200kLower matches [U]*[Lw]+(contraction)? at s[p], or returns 0: the
// greedy U* gives back one rune at a time until Lw+ can match.
func o200kLower(s string, p int) int {
	e := scanWhile(s, p, clsU)
	q := e
	for {
		if q < len(s) {
			if c, w := classAt(s, q); c&clsW != 0 {
				end := scanWhile(s, q+w, clsW)
				return end + contraction(s, end)
			}
		}
		if q == p {
			return 0
		}
		_, w := utf8.DecodeLastRuneInString(s[p:q])
		q -= w
	}
}

// o200kUpper matches [U]+[Lw]*(contraction)? at s[p], whose rune is in U.
func o200kUpper(s string, p int) int {
	e := scanWhile(s, p, clsU)
	e = scanWhile(s, e, clsW)
	return e + contraction(s, e)
}

// validUTF8 returns s with each invalid byte replaced by U+FFFD, the way
// the regular expression engines read it.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		b = utf8.AppendRune(b, r)
		i += w
	}
	return string(b)
}
