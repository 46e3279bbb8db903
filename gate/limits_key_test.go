package gate

import (
	"testing"

	"github.com/costgate/costgate/weighted"
)

// TestLimitKeyValuesChooseNoHashTag: a limit keyed by values the caller
// chooses (a model, a route, an attribute, an RLS descriptor's value) and
// not by the caller has no hash tag: its key is hashed whole. A value
// with braces must not give it one: "x{acme}" would put the counter in
// tenant acme's Redis Cluster slot, under acme's generation marker (a
// stale answer there restores acme's counters). And the escaping keeps
// every value on its own key: a value spelled with the escapes is
// another value.
func TestLimitKeyValuesChooseNoHashTag(t *testing.T) {
	l := &compiledLimit{dims: []string{"model", "route"}}
	seen := map[string]string{}
	for _, v := range []string{"{acme}", "x{acme}y", "{", "}", "}{acme}", "{}", "%7Bacme%7D", "a:{b}=c", "gpt-4o", "%", "%25"} {
		key := l.key(&Reservation{model: v, req: Request{Route: "/v1/x{acme}"}})
		if tag := weighted.HashTag(key); tag != key {
			t.Errorf("model %q: key %q has the hash tag %q", v, key, tag)
		}
		if other, dup := seen[key]; dup {
			t.Errorf("models %q and %q share the key %q", other, v, key)
		}
		seen[key] = v
	}
	if key := l.key(&Reservation{model: "gpt-4o", req: Request{Route: "/v1/chat"}}); key != ":model=gpt-4o:route=/v1/chat" {
		t.Errorf("a plain key changed: %q", key)
	}
}
