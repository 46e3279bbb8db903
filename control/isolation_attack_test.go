package control_test

// Attacks of a tenant on how its control-plane keys identify it: the
// secrets a rotation leaves behind, and a revoked key on every data-plane
// surface, not only the proxied routes.

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// isoData sends method path with body to r's data plane with key and
// returns the status.
func isoData(t *testing.T, r *replica, key, method, path, body string) int {
	t.Helper()
	req, _ := http.NewRequest(method, r.data+path, strings.NewReader(body))
	req.Header.Set("x-api-key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestIsolationAttackRotationLeavesOneOldSecret: a key rotated twice with
// a grace period keeps only the secret the last rotation replaced: the
// first secret, which may be the leaked one, works nowhere once rotated
// past, nor after a change of the key; a rotation without grace ends the
// old secret at once; a revocation ends every secret, and the revoked key
// cannot be made active again. Held.
func TestIsolationAttackRotationLeavesOneOldSecret(t *testing.T) {
	a, b := cpraceTwo(t)
	var k created
	a.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"t1"}`, &k)
	within(t, "the key on b", 2*time.Second, func() bool { st, _ := b.chat(t, k.Key); return st == 200 })
	s1 := k.Key
	var r2, r3, r4 created
	a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/rotate", `{"grace":"1h"}`, &r2)
	a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/rotate", `{"grace":"1h"}`, &r3)
	within(t, "the third secret on b", 2*time.Second, func() bool { st, _ := b.chat(t, r3.Key); return st == 200 })
	a.must(t, 200, "PATCH", "/admin/v1/keys/"+k.ID, `{"metadata":{"who":"x"}}`, nil)
	for _, r := range []*replica{a, b} {
		if st, body := r.chat(t, s1); st != 401 {
			t.Errorf("the first secret, rotated past twice: %d %s", st, body)
		}
		if st, _ := r.chat(t, r2.Key); st != 200 {
			t.Errorf("the second secret in its grace: %d", st)
		}
	}
	a.must(t, 200, "POST", "/admin/v1/keys/"+k.ID+"/rotate", `{"grace":"0s"}`, &r4)
	within(t, "the second secret ended on b", 2*time.Second, func() bool { st, _ := b.chat(t, r3.Key); return st == 401 })
	for _, r := range []*replica{a, b} {
		for i, s := range []string{s1, r2.Key, r3.Key} {
			if st, _ := r.chat(t, s); st != 401 {
				t.Errorf("secret %d after a rotation without grace: %d", i+1, st)
			}
		}
	}
	a.must(t, 200, "DELETE", "/admin/v1/keys/"+k.ID, "", nil)
	if st, body := a.call(t, "test-admin", "PATCH", "/admin/v1/keys/"+k.ID, `{"active":true}`, nil); st < 400 {
		t.Errorf("a revoked key made active again: %d %s", st, body)
	}
	within(t, "the revoked key on b", 2*time.Second, func() bool { st, _ := b.chat(t, r4.Key); return st == 401 })
	// Every data-plane surface refuses the revoked key, not only the
	// proxied routes.
	for _, r := range []*replica{a, b} {
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/v1/costgate/usage", ""},
			{"GET", "/v1/models", ""},
			{"POST", "/v1/costgate/reserve", `{"cost":{"tokens":10}}`},
			{"POST", "/v1/costgate/release", `{"reservation_id":"rsv_x"}`},
			{"POST", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
		} {
			for i, s := range []string{s1, r2.Key, r3.Key, r4.Key} {
				if st := isoData(t, r, s, c.method, c.path, c.body); st != 401 {
					t.Errorf("%s %s with secret %d of a revoked key: %d", c.method, c.path, i+1, st)
				}
			}
		}
	}
}
