package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestBillAtkConnectionBrokenBeforeTheAnswer: the upstream has the whole
// request and runs it (a long reasoning run), but its connection to
// costgate breaks before the answer's status line (an idle timeout on a
// load balancer between them, the upstream's front end restarted). The
// upstream bills the run. costgate answered 502 upstream_unreachable and
// charged nothing, where the same run cut a byte later (cutAnswer) or by
// costgate's own timeout is charged its output limit: a tenant whose
// requests outlast such a link got them free. A request written whole is
// charged as an answer whose usage cannot be read; one whose connection
// could not be made is not (TestBillAtkUnreachableIsFree).
func TestBillAtkConnectionBrokenBeforeTheAnswer(t *testing.T) {
	var ran atomic.Int64
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		ran.Add(1) // the whole request is here: the run is billed
		panic(http.ErrAbortHandler)
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: roomyLimits, upstream: up})
	e, answer := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4000,"messages":[{"role":"user","content":"write a long essay"}]}`, nil)
	if ran.Load() == 0 {
		t.Fatalf("the upstream never had the request: %s", answer)
	}
	floor := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: 4000})
	if e.Actual.OutputTokens < 4000 || e.ActualCost < floor {
		t.Errorf("ledger: %s %v %+v; the upstream had the request and may bill its 4000 output tokens (%v)", e.Status, e.ActualCost, e.Actual, floor)
	}
	if !strings.Contains(string(answer), "charged") || strings.Contains(string(answer), "not charged") {
		t.Errorf("the answer does not say the request is charged: %s", answer)
	}
}

// TestBillAtkGenericConnectionBrokenBeforeTheAnswer: as above, for a
// generic upstream whose answer reports its credits: charged the most
// its rule lets the answer report, as on its timeout.
func TestBillAtkGenericConnectionBrokenBeforeTheAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	s := newStackWith(t, stackOptions{policies: allowAll, extra: billAtkGeneric(srv.URL)})
	resp, _ := billAtkFetch(t, s)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
	if e.Actual.Units < 100 || e.ActualCost < 100*1_000_000 {
		t.Errorf("charged %d credits (%v) for a call the upstream had whole; want its actual's max, 100", e.Actual.Units, e.ActualCost)
	}
}

// TestBillAtkUnreachableIsFree: an upstream whose connection cannot be
// made never had the request, and nothing is charged for it.
func TestBillAtkUnreachableIsFree(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	base := srv.URL
	srv.Close() // nothing listens there now
	s := newStackWith(t, stackOptions{policies: allowAll, extra: billAtkGeneric(base)})
	resp, body := billAtkFetch(t, s)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, body)
	}
	e := billAtkEntry(t, s, resp.Header.Get("X-Request-Id"))
	if e.ActualCost != 0 || e.Actual.Units != 0 {
		t.Errorf("charged %d credits (%v) for a call that never reached the upstream", e.Actual.Units, e.ActualCost)
	}
}
