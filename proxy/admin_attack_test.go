package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

// TestAdminAttackLongModelNamesNotRetained: with the reserve API a tenant
// settles a reservation with the upstream's answer as it chooses to report
// it, so the model that answer names is the tenant's to choose. Whatever
// its length, what the proxy keeps of such names once the calls are over
// must stay small: telemetry folds models into a bounded label set
// (MaxModels) and cuts each value at telemetry.MaxLabelLen bytes.
func TestAdminAttackLongModelNamesNotRetained(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll})
	h := s.srv.Handler()
	const n, nameLen = 30, 1000000 // under the API's 1 MiB body limit
	settle := func(i int) {
		t.Helper()
		id := reserveOn(t, s, "cg-test-acme", `{"model":"gpt-4o-mini","cost":{"tokens":10}}`)
		model := fmt.Sprintf("m%03d-", i) + strings.Repeat("x", nameLen)
		body := fmt.Sprintf(`{"reservation_id":%q,"kind":"chat_completions","response":{"model":%q,"usage":{"prompt_tokens":3,"completion_tokens":2}}}`, id, model)
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", body); code != 200 {
			t.Fatalf("settle %d: %d %v", i, code, out)
		}
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	settle(-1) // the first call's one-time allocations are not the attack's
	before := heap()
	for i := range n {
		settle(i)
	}
	after := heap()
	if grown := int64(after) - int64(before); grown > 8<<20 {
		t.Errorf("the heap kept %d MB more after %d settlements naming distinct %d-byte models, want at most 8 MB",
			grown>>20, n, nameLen)
	}
	runtime.KeepAlive(s)
}

// TestAdminAttackLongRequestModelNotRetained: the model a chat request asks
// for is the tenant's text, up to the body limit (8 MiB by default). A
// request whose model the ledger refuses (over 4096 bytes) is answered 400,
// and nothing of its multi-megabyte name may stay behind.
func TestAdminAttackLongRequestModelNotRetained(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll})
	const n, nameLen = 30, 1 << 20
	send := func(i int) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
			fmt.Sprintf("m%03d-", i)+strings.Repeat("x", nameLen))
		req, _ := http.NewRequest("POST", s.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	send(-1)
	before := heap()
	for i := range n {
		send(i)
	}
	after := heap()
	if grown := int64(after) - int64(before); grown > 8<<20 {
		t.Errorf("the heap kept %d MB more after %d requests asking for distinct %d-byte models, want at most 8 MB",
			grown>>20, n, nameLen)
	}
	runtime.KeepAlive(s)
}
