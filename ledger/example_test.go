package ledger_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// The proxy reserves the estimate before it forwards a request and settles
// what the upstream reported afterwards.
func Example() {
	dir, err := os.MkdirTemp("", "ledger-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Config{Dir: dir}) // embedded store
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l.Reserve(ctx, ledger.Entry{
		RequestID: "req-1", Tenant: "acme", User: "ann", Model: "gpt-4o-mini", CreatedAt: at,
		Estimated:     costmodel.Usage{InputTokens: 1200, OutputTokens: 800},
		EstimatedCost: 660_000, // $0.00066
	})
	l.Settle(ctx, ledger.Entry{
		RequestID: "req-1", HTTPStatus: 200,
		Actual:     costmodel.Usage{InputTokens: 1200, OutputTokens: 150},
		ActualCost: 270_000,
	})
	if err := l.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	spend, _ := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month", At: at})
	page, _ := l.Entries(ctx, ledger.Query{Tenant: "acme"})
	e := page.Entries[0]
	fmt.Println(e.RequestID, e.Status, e.Actual.OutputTokens, e.ActualCost)
	fmt.Println("month to date:", spend)
	// Output:
	// req-1 settled 150 $0.000270000
	// month to date: $0.000270000
}

// Export writes a tenant's entries for billing; "cloudevents" gives usage
// events in the shape OpenMeter ingests.
func ExampleLedger_Export() {
	dir, err := os.MkdirTemp("", "ledger-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Config{Dir: dir, EventSource: "costgate-eu-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l.Settle(ctx, ledger.Entry{
		RequestID: "req-7", Tenant: "acme", Model: "gpt-4o-mini", CreatedAt: at, SettledAt: at, HTTPStatus: 200, Requests: 1,
		Actual:     costmodel.Usage{InputTokens: 1000, OutputTokens: 100},
		ActualCost: 210_000,
	})
	l.Flush(ctx)
	q := ledger.Query{Tenant: "acme", From: at.Add(-time.Hour), To: at.Add(time.Hour)}
	if err := l.Export(ctx, os.Stdout, q, "cloudevents"); err != nil {
		log.Fatal(err)
	}
	// Output:
	// [
	// {"specversion":"1.0","id":"req-7","source":"costgate-eu-1","type":"com.costgate.usage","subject":"acme","time":"2026-05-01T12:00:00Z","datacontenttype":"application/json","data":{"tenant":"acme","model":"gpt-4o-mini","status":"settled","http_status":200,"requests":1,"input_tokens":1000,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":100,"reasoning_tokens":0,"units":0,"cost_nanousd":210000,"cost_usd":"0.000210000"}}
	// ]
}
