package control_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// The control plane changing while requests are in flight, across two
// replicas that share one PostgreSQL and one Redis and poll every 100 ms.

// cpraceTwo starts two replicas on one PostgreSQL and one Redis, with a
// tenant t1 made on the first.
func cpraceTwo(t *testing.T) (a, b *replica) {
	t.Helper()
	dsn, rd, up := pgtest.New(t), redistest.New(t), simulatorURL(t)
	a = newReplica(t, up, replicaOptions{dsn: dsn, redis: rd.URL})
	b = newReplica(t, up, replicaOptions{dsn: dsn, redis: rd.URL})
	a.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	return a, b
}

// cpraceLevel is the key's level state of budget name, as GET
// /admin/v1/keys/{id}/levels shows it on r.
func cpraceLevel(t *testing.T, r *replica, id, name string) (amount, spent costmodel.NanoUSD) {
	t.Helper()
	var out struct {
		Levels []struct {
			Name      string `json:"name"`
			AmountUSD string `json:"amount_usd"`
			SpentUSD  string `json:"spent_usd"`
		} `json:"levels"`
	}
	r.must(t, 200, "GET", "/admin/v1/keys/"+id+"/levels", "", &out)
	for _, l := range out.Levels {
		if l.Name == name {
			am, err1 := costmodel.ParseUSD(l.AmountUSD)
			sp, err2 := costmodel.ParseUSD(l.SpentUSD)
			if err1 != nil || err2 != nil {
				t.Fatalf("level %s: %+v", name, l)
			}
			return am, sp
		}
	}
	t.Fatalf("no level %s in %+v", name, out.Levels)
	return 0, 0
}

// TestCPRaceAttackResetRacingRequests: a budget spent for the day is reset
// on one replica while 24 callers hammer the key on both replicas. The
// reset starts one fresh budget, not two: the replica that has not polled
// yet still debits the spent counter (402), the other the new one; the
// requests admitted from the reset on must fit one fresh budget, as many as
// a fresh budget admitted alone before.
func TestCPRaceAttackResetRacingRequests(t *testing.T) {
	a, b := cpraceTwo(t)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"id":"b","amount_usd":"0.0002","period":"day"}]}`, &k)
	within(t, "the key on b", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st != 401 })
	// b's probe may have spent one request: count what a fresh budget
	// admits from here, on both replicas.
	fresh, st := ctlAtkSpend(t, a, k.Key, 100)
	if st != 402 {
		t.Fatalf("spending the budget: %d admitted, then %d", fresh, st)
	}
	if st, body := b.chat(t, k.Key); st != 402 {
		t.Fatalf("the other replica on the spent budget: %d %s", st, body)
	}
	fresh++ // b's probe, admitted on the same fresh budget
	h := cpraceHammer(t, a, b, k.Key, 2)
	a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/budgets/b/reset", "", nil)
	// Both replicas have the reset after a poll; the callers then spend the
	// fresh budget to its end.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		_, spent := cpraceLevel(t, b, k.ID, "key/"+k.ID+"/b")
		if spent > 0 {
			if st, _ := a.chat(t, k.Key); st == 402 {
				if st, _ := b.chat(t, k.Key); st == 402 {
					break
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := h.halt(); n > int64(fresh) || n == 0 {
		t.Fatalf("after one reset, %d requests admitted; a fresh budget admits %d", n, fresh)
	}
	amount, spent := cpraceLevel(t, a, k.ID, "key/"+k.ID+"/b")
	if spent < amount/2 || spent > amount+amount/4 {
		t.Fatalf("after the reset the budget shows %s spent of %s", spent, amount)
	}
}

// TestCPRaceAttackRaiseExpires: a spent budget raised for a second on one
// replica is spent again on the other; when the raise expires, both
// replicas refuse at once (no poll needed: the raise carries its end), the
// spend made under the raise is kept, and the view shows the old amount.
func TestCPRaceAttackRaiseExpires(t *testing.T) {
	a, b := cpraceTwo(t)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"id":"b","amount_usd":"0.0001","period":"day"}]}`, &k)
	if n, st := ctlAtkSpend(t, a, k.Key, 100); st != 402 || n == 0 {
		t.Fatalf("spending the budget: %d admitted, then %d", n, st)
	}
	name := "key/" + k.ID + "/b"
	_, before := cpraceLevel(t, a, k.ID, name)
	until := time.Now().Add(1500 * time.Millisecond).UTC()
	a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/budgets/b/raise",
		fmt.Sprintf(`{"amount_usd":"0.0003","until":%q}`, until.Format(time.RFC3339Nano)), nil)
	within(t, "the raise on b", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 })
	if n, st := ctlAtkSpend(t, b, k.Key, 100); st != 402 {
		t.Fatalf("spending the raised budget: %d admitted, then %d", n, st)
	}
	amount, raised := cpraceLevel(t, b, k.ID, name)
	if amount != costmodel.NanoUSD(300_000) || raised <= before {
		t.Fatalf("under the raise: %s spent of %s, %s before", raised, amount, before)
	}
	for time.Now().Before(until) {
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range []*replica{a, b} {
		if st, body := r.chat(t, k.Key); st != 402 {
			t.Fatalf("after the raise expired: %d %s", st, body)
		}
		amount, spent := cpraceLevel(t, r, k.ID, name)
		if amount != costmodel.NanoUSD(100_000) || spent < raised {
			t.Fatalf("after the raise expired the view shows %s spent of %s; %s was spent under the raise", spent, amount, raised)
		}
	}
}

// TestCPRaceAttackLoweredBelowSpend: a budget lowered below what was spent
// this period refuses on both replicas within a poll, and the views show
// the spend as it is, not the lowered amount.
func TestCPRaceAttackLoweredBelowSpend(t *testing.T) {
	a, b := cpraceTwo(t)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","budgets":[{"id":"b","amount_usd":"1.00","period":"day"}]}`, &k)
	for range 6 {
		if st, body := a.chat(t, k.Key); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	name := "key/" + k.ID + "/b"
	_, spent := cpraceLevel(t, a, k.ID, name)
	if spent <= 0 {
		t.Fatalf("nothing spent")
	}
	low := spent / 3
	a.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, fmt.Sprintf(`{"budgets":[{"id":"b","amount_usd":%q,"period":"day"}]}`, low.String()), nil)
	if st, body := a.chat(t, k.Key); st != 402 {
		t.Fatalf("on the replica that lowered it: %d %s", st, body)
	}
	// b admits what it is asked until it polls the change: the spend may
	// grow by those, and both views show it.
	within(t, "b refuses", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 402 })
	_, spent = cpraceLevel(t, a, k.ID, name)
	for _, r := range []*replica{a, b} {
		amount, shown := cpraceLevel(t, r, k.ID, name)
		if amount != low || shown != spent || shown <= low {
			t.Fatalf("after the budget went below the spend: the view shows %s spent of %s; %s was spent", shown, amount, spent)
		}
	}
}

// TestCPRaceAttackRevokeAndRotateAcrossReplicas: a key revoked on one
// replica while callers use it on both stops at once on that replica and
// within a poll (100 ms; 1 s allowed here) on the other; a team's expiry
// ends its keys on both replicas at that instant; a secret rotated with a
// grace period works on both until the grace ends, then on neither.
func TestCPRaceAttackRevokeAndRotateAcrossReplicas(t *testing.T) {
	a, b := cpraceTwo(t)
	t.Run("revoke", func(t *testing.T) {
		var k created
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k)
		within(t, "the key on b", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 })
		var (
			wg        sync.WaitGroup
			stop      atomic.Bool
			revokedAt atomic.Int64
			lateMu    sync.Mutex
			late      []time.Duration // b's admissions of requests sent after the revoke
		)
		var calls atomic.Int64
		for range 6 {
			wg.Go(func() {
				for !stop.Load() {
					calls.Add(1)
					sent := time.Now()
					st, body := b.chat(t, k.Key)
					if st != 200 && st != 401 {
						t.Errorf("status %d: %s", st, body)
						return
					}
					if r := revokedAt.Load(); st == 200 && r > 0 && sent.UnixNano() > r {
						lateMu.Lock()
						late = append(late, sent.Sub(time.Unix(0, r)))
						lateMu.Unlock()
					}
				}
			})
		}
		within(t, "the callers running", time.Second, func() bool { return calls.Load() > 12 })
		a.must(t, 200, "DELETE", "/admin/v1/keys/"+k.ID, "", nil)
		revokedAt.Store(time.Now().UnixNano())
		if st, body := a.chat(t, k.Key); st != 401 {
			t.Fatalf("on the replica that revoked it: %d %s", st, body)
		}
		took := within(t, "b refuses the revoked key", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 401 })
		stop.Store(true)
		wg.Wait()
		slices.Sort(late)
		if len(late) > 0 && late[len(late)-1] > time.Second {
			t.Fatalf("b admitted a request sent %s after the revoke", late[len(late)-1])
		}
		t.Logf("b stopped %s after the revoke; %d requests admitted meanwhile", took, len(late))
	})
	t.Run("team expires", func(t *testing.T) {
		// An expiry needs no poll: every replica holds it and checks it
		// on each request.
		var tm, k created
		a.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t1","name":"expiring"}`, &tm)
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"expiring"}`, &k)
		within(t, "the key on b", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 })
		end := time.Now().Add(time.Second).UTC()
		a.must(t, 200, "PATCH", "/admin/v1/teams/"+tm.ID, fmt.Sprintf(`{"expires_at":%q}`, end.Format(time.RFC3339Nano)), nil)
		within(t, "the expiry on b", time.Second, func() bool {
			var e struct {
				ExpiresAt *time.Time `json:"expires_at"`
			}
			b.must(t, 200, "GET", "/admin/v1/teams/"+tm.ID, "", &e)
			return e.ExpiresAt != nil
		})
		for time.Now().Before(end) {
			time.Sleep(20 * time.Millisecond)
		}
		for _, r := range []*replica{a, b} {
			if st, body := r.chat(t, k.Key); st != 401 {
				t.Fatalf("a key of a team past its expiry: %d %s", st, body)
			}
		}
	})
	t.Run("rotate with grace", func(t *testing.T) {
		var k, rot created
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k)
		within(t, "the key on b", time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 })
		a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/rotate", `{"grace":"1500ms"}`, &rot)
		end := time.Now().Add(1500 * time.Millisecond)
		within(t, "the new secret on b", time.Second, func() bool { st, _ := b.chat(t, rot.Key); return st == 200 })
		for _, r := range []*replica{a, b} {
			if st, body := r.chat(t, k.Key); st != 200 && time.Now().Before(end.Add(-200*time.Millisecond)) {
				t.Fatalf("the old secret in its grace period: %d %s", st, body)
			}
		}
		for time.Now().Before(end) {
			time.Sleep(20 * time.Millisecond)
		}
		for _, r := range []*replica{a, b} {
			if st, body := r.chat(t, k.Key); st != 401 {
				t.Fatalf("the old secret after its grace period: %d %s", st, body)
			}
			if st, body := r.chat(t, rot.Key); st != 200 {
				t.Fatalf("the new secret: %d %s", st, body)
			}
		}
	})
}

// TestCPRaceAttackConcurrentAdmin: admin writes racing on both replicas.
// Creating one name eight times at once makes one entity (the others are
// 409, never 500 or 503); PATCHes of different fields of one entity at
// once lose none of them.
func TestCPRaceAttackConcurrentAdmin(t *testing.T) {
	a, b := cpraceTwo(t)
	race := func(n int, f func(i int, r *replica) int) map[int]int {
		var (
			mu  sync.Mutex
			out = map[int]int{}
			wg  sync.WaitGroup
		)
		start := make(chan struct{})
		for i := range n {
			r := a
			if i%2 == 1 {
				r = b
			}
			wg.Go(func() {
				<-start
				st := f(i, r)
				mu.Lock()
				out[st]++
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		return out
	}
	for _, c := range []struct{ name, path, body string }{
		{"tenant", "/admin/v1/tenants", `{"name":"t2"}`},
		{"team", "/admin/v1/teams", `{"tenant":"t1","name":"research"}`},
		{"user", "/admin/v1/users", `{"tenant":"t1","name":"alice"}`},
	} {
		got := race(8, func(_ int, r *replica) int { st, _ := r.call(t, "test-admin", "POST", c.path, c.body, nil); return st })
		if got[201] != 1 || got[409] != 7 {
			t.Fatalf("%s created eight times at once: %v, want one 201 and seven 409", c.name, got)
		}
	}
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"research"}`, &k)
	patches := []string{
		`{"models":["gpt-4o-mini"]}`,
		`{"metadata":{"owner":"ops"}}`,
		`{"budgets":[{"id":"b","amount_usd":"2.00","period":"day"}]}`,
		`{"routes":["/v1/chat/completions"]}`,
		`{"expires_at":"2100-01-01T00:00:00Z"}`,
	}
	got := race(len(patches), func(i int, r *replica) int {
		st, _ := r.call(t, "test-admin", "PATCH", "/admin/v1/keys/"+k.ID, patches[i], nil)
		return st
	})
	if got[200] != len(patches) {
		t.Fatalf("concurrent PATCHes: %v", got)
	}
	for _, r := range []*replica{a, b} {
		var e struct {
			Models    []string          `json:"models"`
			Metadata  map[string]string `json:"metadata"`
			Budgets   []json.RawMessage `json:"budgets"`
			Routes    []string          `json:"routes"`
			ExpiresAt *time.Time        `json:"expires_at"`
		}
		within(t, "the PATCHes on the replica", time.Second, func() bool {
			r.must(t, 200, "GET", "/admin/v1/keys/"+k.ID, "", &e)
			return true
		})
		if len(e.Models) != 1 || e.Metadata["owner"] != "ops" || len(e.Budgets) != 1 || len(e.Routes) != 1 || e.ExpiresAt == nil {
			t.Fatalf("a PATCH was lost: %+v", e)
		}
	}
}

// hammer is 24 callers sending chats with one key until halted.
type hammer struct {
	admitted, sent atomic.Int64
	stop           atomic.Bool
	wg             sync.WaitGroup
}

// cpraceHammer starts 24 callers of key, every every-th on b and the
// others on a, and returns once they are running. A status other than 200
// or 402 fails t.
func cpraceHammer(t *testing.T, a, b *replica, key string, every int) *hammer {
	h := &hammer{}
	for i := range 24 {
		r := a
		if i%every == every-1 {
			r = b
		}
		h.wg.Go(func() {
			for !h.stop.Load() {
				h.sent.Add(1)
				switch st, body := r.chat(t, key); st {
				case 200:
					h.admitted.Add(1)
				case 402:
				default:
					t.Errorf("status %d: %s", st, body)
					return
				}
			}
		})
	}
	within(t, "the callers running", time.Second, func() bool { return h.sent.Load() > 48 })
	return h
}

// halt stops the callers and returns how many requests were admitted.
func (h *hammer) halt() int64 {
	h.stop.Store(true)
	h.wg.Wait()
	return h.admitted.Load()
}

// TestCPRaceAttackBudgetChangedUnderLoad: a budget spent for the day is
// renamed (a key's or a team's), added, or given another period, while 24
// callers hammer the key on both replicas. The changed budget's counter
// has not counted the day (a new key, or a window of another length);
// were it debited before it is brought up to the ledger's spend, every
// request admitted meanwhile would be forgotten by the restore, which
// raises a counter to the ledger's spend and no further. The day's spend
// is the new budget's whole amount, so every request after the change
// must be 402. Each case runs a few times: the window lasted a restore's
// ledger flush and read.
func TestCPRaceAttackBudgetChangedUnderLoad(t *testing.T) {
	a, b := cpraceTwo(t)
	for _, c := range []struct {
		name string
		team bool
		to   string
	}{
		{"key's renamed", false, `{"id":"c","amount_usd":"0.0002","period":"day"}`},
		{"team's renamed", true, `{"id":"c","amount_usd":"0.0002","period":"day"}`},
		{"key's added", false, `{"id":"b","amount_usd":"0.0002","period":"day"},{"id":"c","amount_usd":"0.0002","period":"week"}`},
		{"day to week", false, `{"id":"b","amount_usd":"0.0002","period":"week"}`},
		{"day to 72h", false, `{"id":"b","amount_usd":"0.0002","period":"72h"}`},
		{"day to month", false, `{"id":"b","amount_usd":"0.0002","period":"month"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			for round := range 3 {
				if n := cpraceChangeUnderLoad(t, a, b, c.team, c.to); n > 0 {
					t.Fatalf("round %d: %d requests admitted after the change, on a budget whose spend for the day is its whole amount", round, n)
				}
			}
		})
	}
}

var cpraceTeams atomic.Int64

// cpraceChangeUnderLoad spends a day budget b of $0.0002 (a new key's, or
// with team a new team's, through a key of it), then PATCHes the budget's
// owner's budgets to to while callers hammer the key on a and b, and
// returns how many requests were admitted.
func cpraceChangeUnderLoad(t *testing.T, a, b *replica, team bool, to string) int64 {
	t.Helper()
	const budget = `{"budgets":[{"id":"b","amount_usd":"0.0002","period":"day"}]`
	var k, tm created
	if team {
		name := fmt.Sprintf("team%d", cpraceTeams.Add(1))
		a.must(t, 201, "POST", "/admin/v1/teams", budget+`,"tenant":"t1","name":"`+name+`"}`, &tm)
		a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1","team":"`+name+`"}`, &k)
	} else {
		a.must(t, 201, "POST", "/admin/v1/keys", budget+`,"tenant":"t1"}`, &k)
	}
	if n, st := ctlAtkSpend(t, a, k.Key, 100); st != 402 || n == 0 {
		t.Fatalf("spending the budget: %d admitted, then %d", n, st)
	}
	within(t, "the key on b", 5*time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 402 })
	h := cpraceHammer(t, a, b, k.Key, 4)
	path := "/admin/v1/keys/" + k.ID
	if team {
		path = "/admin/v1/teams/" + tm.ID
	}
	a.must(t, 200, "PATCH", path, `{"budgets":[`+to+`]}`, nil)
	// b polls the change too (100 ms) while the callers go on.
	n := h.sent.Load()
	within(t, "the callers after the change", 10*time.Second, func() bool { return h.sent.Load() > n+200 })
	time.Sleep(150 * time.Millisecond)
	return h.halt()
}
