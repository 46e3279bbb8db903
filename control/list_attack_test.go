package control_test

// Attacks on the listings an operator acts on: a compromised team's keys
// are found by listing them, then revoked. A key the listing leaves out
// keeps working.

import (
	"fmt"
	"net/url"
	"sync"
	"testing"
)

// TestListAtkTeamKeysPastTheFirstRows: a tenant with more than a
// thousand keys, some of them its team's: listing the team's keys, page
// after page as the answers' next says, finds every one of them, and
// the user filter alike. Before, a filtered page read the first thousand
// keys in id order only, came back short with no next, and the team's
// keys past them were never listed.
func TestListAtkTeamKeysPastTheFirstRows(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{})
	r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"t1"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"t1","name":"ops"}`, nil)
	r.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"t1","name":"ann"}`, nil)
	// 1200 keys of nobody, and 40 of the team and user among them: key
	// ids are random, so some of the 40 sort past the 1000th key.
	var (
		mu   sync.Mutex
		ours = map[string]bool{}
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
	)
	for i := range 1240 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			body := `{"tenant":"t1"}`
			if i%31 == 0 {
				body = `{"tenant":"t1","team":"ops","user":"ann"}`
			}
			var k created
			if st, b := r.call(t, "test-admin", "POST", "/admin/v1/keys", body, &k); st != 201 {
				t.Errorf("create: %d %s", st, b)
				return
			}
			if i%31 == 0 {
				mu.Lock()
				ours[k.ID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, filter := range []string{"team=ops", "user=ann", "team=ops&user=ann"} {
		for _, limit := range []int{7, 100} {
			t.Run(fmt.Sprintf("%s limit %d", filter, limit), func(t *testing.T) {
				found, after := map[string]bool{}, ""
				for pages := 0; ; pages++ {
					if pages > len(ours) {
						t.Fatal("the pages do not end")
					}
					var page struct {
						Keys []struct {
							ID, Team, User string
						} `json:"keys"`
						Next string `json:"next"`
					}
					path := fmt.Sprintf("/admin/v1/keys?tenant=t1&%s&limit=%d", filter, limit)
					if after != "" {
						path += "&after=" + url.QueryEscape(after)
					}
					r.must(t, 200, "GET", path, "", &page)
					for _, k := range page.Keys {
						if !ours[k.ID] || found[k.ID] {
							t.Fatalf("listed %+v: not the team's, or twice", k)
						}
						found[k.ID] = true
					}
					if page.Next == "" {
						break
					}
					after = page.Next
				}
				if len(found) != len(ours) {
					t.Fatalf("listing %s found %d of the %d keys; the others stay unlisted (and unrevoked)", filter, len(found), len(ours))
				}
			})
		}
	}
}

// TestListAtkTeamFilterWithoutTenant: a team's name is unique within its
// tenant only. Listing the keys of team "ops" without a tenant, to revoke
// a compromised team's keys, is refused (400), not answered with every
// tenant's team "ops" (before, 200 with the other tenant's keys, which
// the operator then revoked: one tenant switched off by another's
// incident); with the tenant, only its own team's keys come back.
func TestListAtkTeamFilterWithoutTenant(t *testing.T) {
	r := newReplica(t, simulatorURL(t), replicaOptions{})
	keys := map[string]string{}
	for _, tenant := range []string{"t1", "t2"} {
		r.must(t, 201, "POST", "/admin/v1/tenants", `{"name":"`+tenant+`"}`, nil)
		r.must(t, 201, "POST", "/admin/v1/teams", `{"tenant":"`+tenant+`","name":"ops"}`, nil)
		r.must(t, 201, "POST", "/admin/v1/users", `{"tenant":"`+tenant+`","name":"ann"}`, nil)
		var k created
		r.must(t, 201, "POST", "/admin/v1/keys", `{"tenant":"`+tenant+`","team":"ops","user":"ann"}`, &k)
		keys[tenant] = k.ID
	}
	for _, filter := range []string{"team=ops", "user=ann", "team=ops&user=ann", "team=ops&tenant="} {
		if st, body := r.call(t, "test-admin", "GET", "/admin/v1/keys?"+filter, "", nil); st != 400 {
			t.Errorf("keys?%s without a tenant: %d %s, want 400", filter, st, body)
		}
	}
	var page struct {
		Keys []struct {
			ID, Tenant string
		} `json:"keys"`
	}
	r.must(t, 200, "GET", "/admin/v1/keys?tenant=t1&team=ops", "", &page)
	if len(page.Keys) != 1 || page.Keys[0].ID != keys["t1"] {
		t.Fatalf("t1's team ops: %+v", page.Keys)
	}
}
