package rls_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// rawRequest is a RateLimitRequest already in the wire format, sent as it
// is: Envoy's C++ protobuf writes a string that is not UTF-8 (a header of
// the client's holding obs-text bytes), which Go's generated code refuses
// to write.
type rawRequest []byte

// rawCodec sends a rawRequest's bytes and reads everything else as gRPC's
// proto codec does.
type rawCodec struct{}

func (rawCodec) Name() string { return grpcproto.Name }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(rawRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r)}, nil
	}
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

// askRaw sends req with the bytes of each placeholder of subst replaced by
// its value (of the same length) in the wire format.
func (e *env) askRaw(t testing.TB, req *rlsv3.RateLimitRequest, subst ...string) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(subst); i += 2 {
		if len(subst[i]) != len(subst[i+1]) || !bytes.Contains(b, []byte(subst[i])) {
			t.Fatalf("placeholder %q for %q", subst[i], subst[i+1])
		}
		b = bytes.ReplaceAll(b, []byte(subst[i]), []byte(subst[i+1]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := &rlsv3.RateLimitResponse{}
	err = e.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, rawRequest(b), resp, grpc.ForceCodecV2(rawCodec{}))
	return resp, err
}

// TestRLSAtkClientValueCannotFailOpen: an entry's value is often a header
// of the client's that Envoy copies (the user, the model, in the example
// the tenant). A request the server cannot read or refuses as invalid is
// a gRPC error, which Envoy's failure_mode_deny: false (its default, and
// the example's) lets through: a value not UTF-8 (Envoy sends a header's
// obs-text bytes as they are; Go's generated code refuses them), longer
// than 1,024 bytes, or a tenant holding '{' or '}' made the check of
// phase one let the request through unlimited, and the charge of phase
// two vanish, its tokens never counted nor billed. Each is a value like
// any other: the check decides it, the charge is counted and billed.
func TestRLSAtkClientValueCannotFailOpen(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tenant, user string
		subst        []string // placeholders in the wire format, and the bytes they stand for
		limited      bool     // the tenant has a plan of 1,000 tokens a minute
		ledgerTenant string
	}{
		{name: "user not UTF-8", tenant: "acme", user: "u\x01\x02", subst: []string{"u\x01\x02", "u\xff\xfe"}, limited: true, ledgerTenant: "acme"},
		{name: "user of 2,000 bytes", tenant: "acme", user: strings.Repeat("u", 2000), limited: true, ledgerTenant: "acme"},
		{name: "user of 1,500 bytes not UTF-8", tenant: "acme", user: strings.Repeat("\x01", 1500), subst: []string{strings.Repeat("\x01", 1500), strings.Repeat("\xc3", 1500)}, limited: true, ledgerTenant: "acme"},
		{name: "tenant holding a brace", tenant: "acme}x", user: "u", ledgerTenant: "acme%7Dx"},
		{name: "tenant of 2,000 bytes", tenant: strings.Repeat("t", 2000), user: "u"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, unbilledConfig, false, rls.Options{})
			desc := func(n uint64) *rlsv3.RateLimitRequest {
				return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
					hits(n, d("tenant", tc.tenant, "user", tc.user, "model", "test-model", "tokens", "input")),
				}}
			}
			// Phase one: a check.
			resp, err := e.askRaw(t, desc(0), tc.subst...)
			if err != nil || resp.GetOverallCode() != OK {
				t.Fatalf("check: %s, %v; want OK (an error lets Envoy's request through unlimited)", codes_(resp), err)
			}
			// Phase two: 1,000 input tokens served, $0.001: the plan's
			// tokens for the minute.
			resp, err = e.askRaw(t, desc(1000), tc.subst...)
			if err != nil || resp.GetOverallCode() != OK {
				t.Fatalf("charge: %s, %v; want OK, counted", codes_(resp), err)
			}
			if tc.limited {
				resp, err = e.askRaw(t, desc(0), tc.subst...)
				if err != nil || resp.GetOverallCode() != OVER {
					t.Errorf("check after 1,000 tokens charged: %s, %v; want OVER_LIMIT", codes_(resp), err)
				}
			}
			ctx := context.Background()
			if err := e.g.Ledger().Flush(ctx); err != nil {
				t.Fatal(err)
			}
			page, err := e.g.Ledger().Entries(ctx, ledger.Query{})
			if err != nil {
				t.Fatal(err)
			}
			if want := costmodel.NanoUSD(1_000_000); len(page.Entries) != 1 || page.Entries[0].ActualCost != want {
				t.Fatalf("ledger after 1,000 tokens served: %+v, want one entry of %v", page.Entries, want)
			}
			if en := page.Entries[0]; tc.ledgerTenant != "" && en.Tenant != tc.ledgerTenant {
				t.Errorf("ledger tenant %q, want %q", en.Tenant, tc.ledgerTenant)
			}
		})
	}
}

// TestRLSAtkLongValuesCountApart: a value longer than 1,024 bytes is
// written in a descriptor's counter key by its digest; two such values
// that differ only past their start count apart, and each on its own.
func TestRLSAtkLongValuesCountApart(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	long := "/x" + strings.Repeat("x", 2000) // any-route: 1 a minute
	for _, tc := range []struct {
		value, want string
	}{
		{long + "a", "OK OK"},
		{long + "b", "OK OK"},
		{long + "a", "OVER_LIMIT OVER_LIMIT"},
	} {
		if got := codes_(e.ask(t, "edge", 0, d("route", tc.value))); got != tc.want {
			t.Errorf("route of %d bytes ending %q: %s, want %s", len(tc.value), tc.value[len(tc.value)-1:], got, tc.want)
		}
	}
}

// TestRLSAtkAllOrNothingConcurrent: requests of two descriptors (an
// address's limit, in the domain's Redis Cluster slot, and a tenant's
// search limit, in the tenant's) race requests of each alone. Whatever
// the interleaving, a refused request leaves no debit: each limit ends
// with its capacity less exactly the admitted requests that name it, and
// the tenant's plan less the admitted ones that name the tenant.
func TestRLSAtkAllOrNothingConcurrent(t *testing.T) {
	stores(t, func(t *testing.T, redis bool) {
		e := newEnv(t, testConfig, redis, rls.Options{})
		// per-ip is a fixed window of a minute: the requests and the
		// count of what they left must fall in one (a loaded machine
		// takes seconds over them).
		awayFromWindowEnd(time.Minute, 30*time.Second)
		ip := func() *commonv3.RateLimitDescriptor { return d("remote_address", "198.51.100.77") }
		search := func() *commonv3.RateLimitDescriptor { return d("tenant", "globex", "generic_key", "search") }
		kinds := [][]func() *commonv3.RateLimitDescriptor{{ip, search}, {ip}, {search}}
		var admitted [3]atomic.Int64
		var wg sync.WaitGroup
		for w := range 24 {
			wg.Go(func() {
				for i := range 4 {
					k := (w + i) % len(kinds)
					var ds []*commonv3.RateLimitDescriptor
					for _, f := range kinds[k] {
						ds = append(ds, f())
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds})
					cancel()
					if err != nil {
						t.Errorf("ShouldRateLimit: %v", err)
						return
					}
					if resp.GetOverallCode() == OK {
						admitted[k].Add(1)
					}
				}
			})
		}
		wg.Wait()
		both, ipOnly, searchOnly := admitted[0].Load(), admitted[1].Load(), admitted[2].Load()
		t.Logf("admitted: %d of both, %d of the address alone, %d of the search alone", both, ipOnly, searchOnly)
		remaining := func(desc *commonv3.RateLimitDescriptor) uint32 {
			return e.ask(t, "edge", 0, hits(0, desc)).GetStatuses()[0].GetLimitRemaining()
		}
		if got, want := int64(remaining(ip())), 4-both-ipOnly; got != want {
			t.Errorf("per-ip: %d left, want %d (4 less the admitted requests that name it)", got, want)
		}
		// search refills 2 a minute: a token at most while the test runs.
		if got, want := int64(remaining(search())), 2-both-searchOnly; got != want && got != want+1 {
			t.Errorf("search: %d left, want %d", got, want)
		}
		if got, want := int64(remaining(d("tenant", "globex"))), 100-both-searchOnly; got < want || got > want+2 {
			t.Errorf("pro-requests: %d left, want %d", got, want)
		}
	})
}

// TestRLSAtkEmptyModelIsPriced: a descriptor's model is often a header
// (Envoy sends a header present but empty as an empty value). An empty
// model counted as no model at all: the tokens of phase two were counted
// on the token limits but priced at nothing, neither in the budgets nor
// in the ledger (and a control-plane tenant's allowed models, which pass a
// request naming none, did not apply). It is a model no price table
// names, priced and recorded as any other such model is.
func TestRLSAtkEmptyModelIsPriced(t *testing.T) {
	cost := func(model string) costmodel.NanoUSD {
		e := newEnv(t, unbilledConfig, false, rls.Options{})
		resp := e.ask(t, "edge", 0, hits(1000, d("tenant", "acme", "user", "u", "model", model, "tokens", "input")))
		if got := codes_(resp); got != "OK OK" {
			t.Fatalf("charge of model %q: %s", model, got)
		}
		ctx := context.Background()
		if err := e.g.Ledger().Flush(ctx); err != nil {
			t.Fatal(err)
		}
		page, err := e.g.Ledger().Entries(ctx, ledger.Query{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) != 1 {
			t.Errorf("ledger after 1,000 tokens of model %q served: %d entries, want one", model, len(page.Entries))
			return 0
		}
		return page.Entries[0].ActualCost
	}
	unknown := cost("no-such-model")
	if unknown <= 0 {
		t.Fatalf("an unknown model's 1,000 tokens cost %v", unknown)
	}
	if got := cost(""); got != unknown {
		t.Errorf("1,000 tokens of an empty model billed %v, want %v as an unknown model's", got, unknown)
	}
}

// TestRLSAtkEmptyTenantKeepsThePlan: a tenant the configuration does not
// list gets the plan its descriptor names (partner: pro, 100 requests a
// minute). An empty value, a header present but empty, named no tenant
// at all: no plan, no budget, no price, where any other unlisted value
// gets the plan. It is a tenant like any other, on a counter of its own.
func TestRLSAtkEmptyTenantKeepsThePlan(t *testing.T) {
	e := newEnv(t, testConfig, false, rls.Options{})
	for _, v := range []string{"newco", ""} {
		st := e.ask(t, "edge", 0, d("partner", v)).GetStatuses()[0]
		if st.GetCurrentLimit().GetName() != "pro-requests" || st.GetLimitRemaining() != 99 {
			t.Errorf("partner %q: %v, want pro-requests with 99 left", v, st)
		}
	}
}
