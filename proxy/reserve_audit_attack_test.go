package proxy_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestReserveAtkStormAcrossReplicas: settles and releases of one
// reservation sent at once to both replicas sharing Redis and a
// PostgreSQL ledger end it one way: every settle agrees on one cost and
// every release is refused (or the other way round), the ledger holds one
// final entry for it, and the limit and the budget are charged exactly
// what the ledger bills.
func TestReserveAtkStormAcrossReplicas(t *testing.T) {
	redisURL, dsn := redistest.New(t).URL, pgtest.New(t)
	extra := "\nreservations:\n  secret: \"replicas-share-this-secret-0123\"\n" + `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 10000000, period: 24h}
budgets:
  - {name: daily, scope: tenant, amount: "1000.00"}
`
	a := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	b := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	const acme, rounds, n = "cg-test-acme", 12, 16
	ids := map[string]bool{}
	for round := range rounds {
		maker := []*stack{a, b}[round%2]
		id := reserveOn(t, maker, acme, `{"cost":{"tokens":1000,"usd":"1.00"}}`)
		ids[id] = true
		type answer struct {
			release bool
			code    int
			first   bool
			cost    string
		}
		answers := make([]answer, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				s := []*stack{a, b}[i%2]
				path, body := "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":%d,"usd":"0.%02d"}}`, id, 10*(i+1), i+1)
				rel := i%4 >= 2
				if rel {
					path, body = "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)
				}
				<-start
				code, out := reserveCall(t, s.srv.Handler(), acme, path, body)
				c, _ := out["cost_usd"].(string)
				answers[i] = answer{rel, code, out["already_settled"] == false, c}
			})
		}
		close(start)
		wg.Wait()
		settled, released, firsts, costs := 0, 0, 0, map[string]bool{}
		for _, an := range answers {
			switch {
			case an.release && an.code == 200:
				released++
			case !an.release && an.code == 200:
				settled++
				costs[an.cost] = true
				if an.first {
					firsts++
				}
			case an.code != 409:
				t.Errorf("round %d: an answer %d; want 200 or 409", round, an.code)
			}
		}
		if settled > 0 && released > 0 || settled == 0 && released == 0 || firsts > 1 || len(costs) > 1 || settled > 0 && firsts != 1 {
			t.Errorf("round %d: %d settles answered 200 (%d first, costs %v), %d releases 200; want it ended one way", round, settled, firsts, costs, released)
		}
	}
	for _, s := range []*stack{a, b} {
		if err := s.srv.WaitIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := s.srv.Ledger().Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var tokens int64
	var billed costmodel.NanoUSD
	seen := map[string]int{}
	for _, e := range a.entries(t) {
		seen[e.RequestID]++
		if !e.Status.Final() || e.Status == ledger.StatusExpired || e.Status == ledger.StatusRecovered {
			t.Errorf("entry %s: %s", e.RequestID, e.Status)
		}
		tokens += e.Actual.InputTokens
		billed += e.ActualCost
	}
	if len(seen) != rounds {
		t.Errorf("%d ledger entries; want %d", len(seen), rounds)
	}
	if left := limitsLeft(t, a); len(left) != 2 || left[0] != 10000000-tokens || left[1] != 1000_000_000_000-int64(billed) {
		t.Errorf("tpm and budget left %v; want %d and %d (the ledger's %d tokens and %v)", left, 10000000-tokens, 1000_000_000_000-int64(billed), tokens, billed)
	}
}

// TestReserveAtkEndsAtOnceAfterRestart: a single node on the in-memory
// store restarts with reservations open (their ledger entries recovered
// at their estimates); each is then settled twice and released at once.
// The node holds none of them and has no Redis to claim in: the ledger
// alone told how one ended, once billed. It still ends once: at most one
// settle answers already_settled false, never beside a release answered
// 200, the settles that succeed agree on its cost, and the ledger bills
// what the answers say. A settle retried past the expiry is told the
// first one, as on the node that holds a reservation, not that it expired
// and was charged its estimate.
func TestReserveAtkEndsAtOnceAfterRestart(t *testing.T) {
	const extra = `
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`
	dir := t.TempDir()
	before := newStackWith(t, stackOptions{extra: extra, dataDir: dir})
	const n = 20
	var ids []string
	for range n {
		ids = append(ids, reserveID(t, before, `{"cost":{"usd":"1.00"},"ttl":"1h"}`))
	}
	short := reserveID(t, before, `{"cost":{"usd":"1.00"},"ttl":"2s"}`)
	if err := before.srv.Close(); err != nil {
		t.Fatal(err)
	}
	s := newStackWith(t, stackOptions{extra: extra, dataDir: dir})
	h := s.srv.Handler()
	want := map[string]string{} // request id: the cost the answers say, "released"
	for i, id := range ids {
		type answer struct {
			code int
			out  map[string]any
			rel  bool
		}
		answers := make([]answer, 3)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for j := range answers {
			wg.Go(func() {
				path, body := "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0.%d0"}}`, id, j+1)
				if j == 2 {
					path, body = "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)
				}
				<-start
				code, out := reserveCall(t, h, "cg-test-acme", path, body)
				answers[j] = answer{code, out, j == 2}
			})
		}
		close(start)
		wg.Wait()
		firsts, released, costs := 0, false, map[string]bool{}
		var rid string
		for _, an := range answers {
			switch {
			case an.code == 200 && an.rel:
				released = true
				rid, _ = an.out["request_id"].(string)
			case an.code == 200:
				if an.out["already_settled"] == false {
					firsts++
				}
				c, _ := an.out["cost_usd"].(string)
				costs[c] = true
				rid, _ = an.out["request_id"].(string)
			case an.code != 409:
				t.Errorf("reservation %d: answer %d %v", i, an.code, an.out)
			}
		}
		if firsts > 1 || released && len(costs) > 0 || len(costs) > 1 {
			t.Errorf("reservation %d: %d first settles, costs %v, released %v; want one end", i, firsts, costs, released)
		}
		for c := range costs {
			want[rid] = c
		}
		if released {
			want[rid] = "released"
		}
	}
	code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0.30"}}`, short))
	if code != 200 || out["already_settled"] != false {
		t.Fatalf("settle of the 2 s reservation: %d %v", code, out)
	}
	want[out["request_id"].(string)] = "0.300000000"
	exp := time.Now().Add(2 * time.Second)
	for time.Now().Before(exp.Add(1500 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond) // polls the wall clock past its expiry and the next expiry pass
	}
	code, out = reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0.90"}}`, short))
	if code != 200 || out["already_settled"] != true || out["cost_usd"] != "0.300000000" {
		t.Errorf("settle retried past the expiry: %d %v; want the first's $0.30, already settled", code, out)
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, short)); code != 409 || errCode(out) != "reservation_settled" {
		t.Errorf("release past the expiry: %d %v; want 409 reservation_settled", code, out)
	}
	for _, e := range s.entries(t) {
		w, ok := want[e.RequestID]
		if !ok {
			t.Errorf("entry %s (%s) ended by no answer", e.RequestID, e.Status)
			continue
		}
		got := strings.TrimPrefix(e.ActualCost.String(), "$")
		if e.Status == ledger.StatusFailed && e.ActualCost == 0 {
			got = "released"
		}
		if got != w {
			t.Errorf("entry %s: %s %s; the answers said %s", e.RequestID, e.Status, got, w)
		}
	}
}

// TestReserveAtkSettledBeforeARestart: a reservation settled on a single
// node (the in-memory store, the embedded ledger) that then restarts is
// still settled once past its expiry: a settle retried then (a client
// whose answer the restart lost) is told the first one, a release is 409
// reservation_settled, as on a node that did not restart, and neither
// says that it expired and was charged its estimate.
func TestReserveAtkSettledBeforeARestart(t *testing.T) {
	const extra = `
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`
	dir := t.TempDir()
	before := newStackWith(t, stackOptions{extra: extra, dataDir: dir})
	code, r := reserveCall(t, before.srv.Handler(), "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"1.00"},"ttl":"2s"}`)
	if code != 200 {
		t.Fatalf("reserve: %d %v", code, r)
	}
	id, _ := r["reservation_id"].(string)
	exp, err := time.Parse(time.RFC3339Nano, r["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	settle := fmt.Sprintf(`{"reservation_id":%q,"usage":{"usd":"0.30"}}`, id)
	if code, out := reserveCall(t, before.srv.Handler(), "cg-test-acme", "/v1/costgate/settle", settle); code != 200 || out["already_settled"] != false {
		t.Fatalf("settle: %d %v", code, out)
	}
	if err := before.srv.Close(); err != nil {
		t.Fatal(err)
	}
	s := newStackWith(t, stackOptions{extra: extra, dataDir: dir})
	h := s.srv.Handler()
	for time.Now().Before(exp.Add(1500 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond) // polls the wall clock past the expiry and the next expiry pass
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", settle); code != 200 || out["already_settled"] != true || out["cost_usd"] != "0.300000000" {
		t.Errorf("settle retried past the expiry after the restart: %d %v; want the first's $0.30, already settled", code, out)
	}
	if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)); code != 409 || errCode(out) != "reservation_settled" {
		t.Errorf("release past the expiry after the restart: %d %v; want 409 reservation_settled", code, out)
	}
	es := s.entries(t)
	if len(es) != 1 || es[0].Status != ledger.StatusSettled || es[0].ActualCost != 300_000_000 {
		t.Errorf("ledger %+v; want one entry settled at $0.30", es)
	}
}
