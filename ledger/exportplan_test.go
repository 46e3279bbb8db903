package ledger_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// TestExportCarriesThePlan: each entry records its caller's plan at the
// decision, and a meter that prices by plan reads it from every export
// format, on every store: the CSV's plan column (neutralised when it
// would start a formula), the JSON entry's plan and the CloudEvent's
// data.plan. An entry of no plan exports an empty cell and no field.
func TestExportCarriesThePlan(t *testing.T) {
	plans := []string{"free", "", "=HYPERLINK(\"http://evil\")", "enterprise"}
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		l := open(t, cfg)
		ctx := context.Background()
		for i, p := range plans {
			id := "p" + string(rune('a'+i))
			e := reservation(id, t0.Add(time.Duration(i)*time.Second))
			e.Plan = p
			if err := l.Reserve(ctx, e); err != nil {
				t.Fatalf("plan %q: %v", p, err)
			}
			if err := l.Settle(ctx, settlement(id, 2_000)); err != nil {
				t.Fatalf("plan %q: %v", p, err)
			}
		}
		flush(t, l)

		var buf bytes.Buffer
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatCSV); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&buf).ReadAll()
		if err != nil || len(rows) != len(plans)+1 {
			t.Fatalf("csv: %d rows, %v", len(rows), err)
		}
		col := slices.Index(rows[0], "plan")
		if col < 0 {
			t.Fatalf("csv header %q has no plan column", rows[0])
		}
		var got []string
		for _, r := range rows[1:] {
			got = append(got, r[col])
		}
		want := []string{"free", "", "'=HYPERLINK(\"http://evil\")", "enterprise"}
		if !slices.Equal(got, want) {
			t.Errorf("csv plans = %q, want %q", got, want)
		}

		buf.Reset()
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatJSON); err != nil {
			t.Fatal(err)
		}
		var es []map[string]any
		if err := json.Unmarshal(buf.Bytes(), &es); err != nil || len(es) != len(plans) {
			t.Fatalf("json: %d entries, %v", len(es), err)
		}
		for i, e := range es {
			if p, _ := e["plan"].(string); p != plans[i] {
				t.Errorf("json entry %d plan = %q, want %q", i, p, plans[i])
			}
		}

		buf.Reset()
		if err := l.Export(ctx, &buf, ledger.Query{Tenant: "acme"}, ledger.FormatCloudEvents); err != nil {
			t.Fatal(err)
		}
		var evs []ledger.CloudEvent
		if err := json.Unmarshal(buf.Bytes(), &evs); err != nil || len(evs) != len(plans) {
			t.Fatalf("cloudevents: %d events, %v", len(evs), err)
		}
		for i, ev := range evs {
			if ev.Data.Plan != plans[i] {
				t.Errorf("cloudevent %d data.plan = %q, want %q", i, ev.Data.Plan, plans[i])
			}
		}
		if bytes.Contains(buf.Bytes(), []byte(`"plan":""`)) {
			t.Errorf("a cloudevent of no plan carries an empty plan field")
		}
	})
}
