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
