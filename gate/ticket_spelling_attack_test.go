package gate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// TestTicketAtkOneSpelling: a reservation id is verified in one spelling
// only. base64 decoders skip line breaks and, unless strict, ignore the
// bits past the data in a last character, so that many strings verified
// as one ticket: an id that is not the one handed out must not be taken
// for it.
func TestTicketAtkOneSpelling(t *testing.T) {
	g := openAcme(t, `
limits:
  - {name: rpm, dimensions: [tenant], unit: requests, rate: 1000000, period: 1m}`)
	c := g.Identify("cg-acme")
	var ids []string
	// Payloads of every length modulo 3, so that some end in a character
	// with spare bits.
	for _, model := range []string{"gpt-4o-mini", "gpt-4o", "gpt-4.1"} {
		res, d := g.Reserve(context.Background(), &Request{Caller: c, Route: "/v1/costgate/reserve",
			Estimate: costmodel.Estimate{Model: model, Usage: costmodel.Usage{InputTokens: 10}}})
		if res == nil {
			t.Fatal(d)
		}
		res.Record(context.Background())
		id, _ := res.Hold(time.Minute)
		ids = append(ids, id)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	spare := 0
	for _, id := range ids {
		if _, ok := g.verify(id); !ok {
			t.Fatalf("the id handed out does not verify: %q", id)
		}
		body := strings.TrimPrefix(id, ticketPrefix)
		p64, s64, _ := strings.Cut(body, ".")
		var variants []string
		for _, cut := range []int{1, len(p64) / 2, len(p64)} {
			for _, br := range []string{"\n", "\r\n", "\r"} {
				variants = append(variants, ticketPrefix+p64[:cut]+br+p64[cut:]+"."+s64)
			}
		}
		variants = append(variants, ticketPrefix+p64+"."+s64[:5]+"\n"+s64[5:])
		// The last character of each part with other spare bits.
		for _, part := range []int{0, 1} {
			s := [2]string{p64, s64}
			last := strings.IndexByte(alphabet, s[part][len(s[part])-1])
			spareBits := map[int]int{2: 4, 3: 2}[len(s[part])%4]
			for v := 1; v < 1<<spareBits; v++ {
				s[part] = s[part][:len(s[part])-1] + string(alphabet[last^v])
				variants = append(variants, ticketPrefix+s[0]+"."+s[1])
				spare++
			}
		}
		for _, v := range variants {
			if _, ok := g.verify(v); ok {
				t.Errorf("another spelling of a reservation id verifies: %q (handed out %q)", v, id)
			}
		}
	}
	if spare == 0 {
		t.Fatal("no id part ends in a character with spare bits: the test did not try them")
	}
}
