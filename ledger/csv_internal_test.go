package ledger

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCSVText writes an entry whose text fields are the fuzzer's string
// through the CSV exporter and reads it back with encoding/csv: every text
// cell is the string, with a leading "'" exactly when the string starts
// with a formula character (or "'"), so that stripping one leading "'"
// gives the value back; and no cell starts with a formula character.
func FuzzCSVText(f *testing.F) {
	for _, s := range []string{"", "gpt-4o", "=HYPERLINK(\"x\")", "+1", "-1", "@A1", "\t=1", "\r=1", "\n=1",
		"＝1", "＋1", "－1", "＠1", "'=1", "a,\"b\"\r\nc", " =1", "\"=1\""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := Entry{
			RequestID: s, Tenant: s, User: s, KeyID: s, Route: s, Upstream: s, Model: s, Region: s,
			Decision: s, Policy: s, Friction: s, Plan: s,
		}
		if e.check() != nil {
			return // the ledger never holds it (invalid UTF-8, NUL, too long)
		}
		var buf bytes.Buffer
		c := &csvExporter{w: csv.NewWriter(&buf)}
		if err := c.entry(&e); err != nil {
			t.Fatal(err)
		}
		if err := c.end(); err != nil {
			t.Fatal(err)
		}
		recs, err := csv.NewReader(&buf).ReadAll()
		if err != nil {
			t.Fatalf("read back %q: %v", buf.String(), err)
		}
		if len(recs) != 1 || len(recs[0]) != len(CSVHeader) {
			t.Fatalf("read back %d records: %q", len(recs), recs)
		}
		// encoding/csv's reader turns \r\n inside a quoted field into \n.
		want := strings.ReplaceAll(s, "\r\n", "\n")
		neutralised := formulaStart(s)
		cells := append(recs[0][:11:11], recs[0][len(recs[0])-1]) // the text columns, and plan, the last
		for i, cell := range cells {
			if i == 11 {
				i = len(CSVHeader) - 1
			}
			// Written out again, not formulaStart, so that a bug there shows.
			if r, _ := utf8.DecodeRuneInString(cell); strings.ContainsRune("=+-@\t\r＝＋－＠", r) {
				t.Fatalf("%s cell %q starts with a formula character", CSVHeader[i], cell)
			}
			got := cell
			if neutralised {
				var ok bool
				if got, ok = strings.CutPrefix(cell, "'"); !ok {
					t.Fatalf("%s cell %q of %q is not neutralised", CSVHeader[i], cell, s)
				}
			}
			if got != want {
				t.Fatalf("%s cell %q, want %q", CSVHeader[i], cell, want)
			}
		}
	})
}
