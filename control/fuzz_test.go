package control

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzValidate: whatever an admin API body holds, validating and
// compiling the entity answers an error or a level, never a panic, and
// what validates compiles.
func FuzzValidate(f *testing.F) {
	f.Add(`{"tenant":"t1","budgets":[{"amount_usd":"1.00","period":"day"}],"models":["gpt-4o"]}`)
	f.Add(`{"tenant":"t1","budgets":[{"amount_usd":"-1","period":"72h","soft_percent":50}]}`)
	f.Add(`{"tenant":"t1","limits":[{"name":"rpm","rate":5,"period":"1m","algorithm":"gcra","burst":9}]}`)
	f.Add(`{"tenant":"t1","limits":[{"name":"usd","unit":"usd","rate_usd":"0.5","period":"1h"}],"routes":["/u/search"]}`)
	f.Add(`{"tenant":"t1","budgets":[{"amount_usd":"1","period":"month"},{"id":"wk","amount_usd":"99999999999.999999999","period":"week"}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		var e Entity
		if json.Unmarshal([]byte(body), &e) != nil {
			return
		}
		e.Kind, e.ID = KindKey, "key_fuzz"
		if e.Tenant == "" || checkName("tenant", e.Tenant) != nil {
			e.Tenant = "t1"
		}
		if err := e.validate(time.Now()); err != nil {
			return
		}
		lv, err := e.level()
		if err != nil {
			t.Fatalf("validated but does not compile: %v", err)
		}
		if lv != nil && len(lv.Limits) != len(e.Budgets)+len(e.Limits) {
			t.Fatalf("%d limits compiled from %d budgets and %d limits", len(lv.Limits), len(e.Budgets), len(e.Limits))
		}
	})
}
