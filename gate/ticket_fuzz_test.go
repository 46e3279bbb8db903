package gate

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// FuzzResumeSigned: a ticket whose payload is anything at all, signed with
// the replicas' secret (as if the secret had leaked, or a bug wrote a bad
// payload), is refused or resumed, and a resumed one settles and
// releases, without a panic: the payload is read as input from outside.
func FuzzResumeSigned(f *testing.F) {
	g := openAcme(f, `
limits:
  - {name: rpm, dimensions: [tenant], unit: requests, rate: 1000000, period: 1m}
  - {name: tpm, dimensions: [tenant, model], unit: tokens, rate: 1000000, period: 1m}
budgets:
  - {name: daily, scope: tenant, amount: "100"}`)
	c := g.Identify("cg-acme")
	res, d := g.Reserve(context.Background(), &Request{Caller: c, Route: "/v1/costgate/reserve",
		Estimate: costmodel.Estimate{Model: "gpt-4o-mini", Usage: costmodel.Usage{InputTokens: 10}}})
	if res == nil {
		f.Fatal(d)
	}
	res.Record(context.Background())
	id, _ := res.Hold(time.Minute)
	payload, ok := g.verify(id)
	if !ok {
		f.Fatal("a fresh ticket does not verify")
	}
	f.Add(payload)
	f.Add([]byte(`{"i":"x","t":"acme","ex":99999999999999999,"it":[{"n":"rpm","k":"{acme}","c":-5},{"n":"nope","k":"","c":9}]}`))
	f.Add([]byte(`{"i":"` + res.ID() + `"`))
	f.Add([]byte(`{"i":"a\"b","t":"acme","ex":99999999999999999,"u":{"input_tokens":-1},"c":-9223372036854775808,"n":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		id := ticketPrefix + base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(g.sign(nil, payload))
		r, _, err := g.Resume(context.Background(), c, id)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.SettleHeld(ctx, Charge{Usage: costmodel.Usage{InputTokens: 3}, HTTPStatus: 200})
		r.Release(ctx)
	})
}
