package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestBilledLossAtkAnswerSettledAfterTheRestore: the proxy bills a
// request's ledger entry as soon as the upstream's answer says what it
// cost, before the answer reaches the client, and settles its limits
// once the client has it. A client that reads its answer slowly (or not
// at all, up to the 30 s a write may wait) holds the request between the
// two; when Redis loses its data then, the restore counts the request at
// its billed usage, and its settlement refunded what its reservation held
// beyond that usage on the restored counter a second time. acme holds an
// answer of max_tokens 800 that used 1 output token; Redis is flushed; a
// request of 100 output tokens restores acme; the client reads its
// answer. On 1,000 output tokens a day, 899 are left: 8 more requests of
// 100 fit. Before, a token bucket and a GCRA were left full, and 10 more
// were admitted: 1,101 tokens of 1,000.
func TestBilledLossAtkAnswerSettledAfterTheRestore(t *testing.T) {
	big := strings.Repeat("x", 7<<20) // more than the loopback's buffers: a client that reads nothing holds the proxy's write
	for _, algo := range []string{"token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"} {
		t.Run(algo, func(t *testing.T) {
			if d := time.Until(time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)); d < time.Minute {
				time.Sleep(d + 100*time.Millisecond)
			}
			rs := redistest.New(t)
			up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
				content, out := "ok", 100
				if strings.Contains(string(body), "hold") {
					content, out = big, 1
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}`, content, out, 8+out)
			}}
			s := newStackWith(t, stackOptions{redisURL: rs.URL, policies: allowAll, upstream: up, extra: fmt.Sprintf(`
limits:
  - {name: acme-output, dimensions: [tenant], unit: output_tokens, rate: 1000, period: 24h, algorithm: %s}
`, algo)})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			held := s.post(t, ctx, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":800,"messages":[{"role":"user","content":"hold"}]}`)
			defer held.Body.Close()
			if held.StatusCode != http.StatusOK {
				t.Fatalf("the held answer: %d", held.StatusCode)
			}
			// Its entry is billed; its limits are not settled while the
			// client reads nothing.
			l := s.srv.Ledger()
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if err := l.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				page, err := l.Entries(ctx, ledger.Query{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour), Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				if es := page.Entries; len(es) == 1 && es[0].Status != ledger.StatusReserved {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the held answer was not billed: %+v", page.Entries)
				}
			}
			opt, err := redis.ParseURL(rs.URL)
			if err != nil {
				t.Fatal(err)
			}
			rc := redis.NewClient(opt)
			defer rc.Close()
			if err := rc.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			send := func() int {
				r := s.post(t, ctx, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"go"}]}`)
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				return r.StatusCode
			}
			if st := send(); st != http.StatusOK { // restores acme
				t.Fatalf("the first request after the loss: %d", st)
			}
			if _, err := io.Copy(io.Discard, held.Body); err != nil {
				t.Fatal(err)
			}
			held.Body.Close()
			if err := s.srv.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}
			n := 1
			for ; n < 30; n++ {
				if st := send(); st != http.StatusOK {
					if st != http.StatusTooManyRequests {
						t.Fatalf("refused with %d", st)
					}
					break
				}
			}
			spent := 1 + 100*n
			t.Logf("after the loss: %d requests of 100 output tokens admitted; %d of 1,000 output tokens spent today", n, spent)
			if spent > 1000 {
				t.Errorf("%d output tokens admitted on a limit of 1,000 a day: the held answer's refund came after the restore had counted its usage", spent)
			}
		})
	}
}
