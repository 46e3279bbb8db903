package jsonscan

import "encoding/json"

// AppendString appends s as a JSON string, exactly as encoding/json
// writes it: a string of printable ASCII without a quote, a backslash or
// an HTML character is copied; any other is encoding/json's to escape
// (control bytes, HTML characters, invalid UTF-8, U+2028 and U+2029).
// It serves the encoders written by hand for the hot paths.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
