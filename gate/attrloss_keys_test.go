package gate

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/costgate/costgate/ledger"
)

// TestAttrLossAtkRestoredKeyIsTheDebitedKey: for every spelling of an
// attribute and of a client address, the key a restore builds from the
// ledger's entry (Gate.ledgerGroupCounters' writtenOf and key) is the
// key the debit used, byte for byte, on each of three limits keyed by
// the address, by two attributes, and by one of them.
func TestAttrLossAtkRestoredKeyIsTheDebitedKey(t *testing.T) {
	ctx := context.Background()
	g, _ := groupGate(t, `{name: by-ip, dimensions: [tenant, ip], unit: requests, rate: 1000, period: 24h}
  - {name: by-both, dimensions: [tenant, attr.team, user, attr.project], unit: requests, rate: 1000, period: 24h}
  - {name: by-team, dimensions: [tenant, attr.team], unit: requests, rate: 1000, period: 24h}`, false)
	ips := []string{"192.0.2.1", "::ffff:192.0.2.1", "2001:db8::1", "fe80::1%eth0", "not an address:{x}=%",
		strings.Repeat("1", 5000), "caf\xe9\x00"}
	debited := map[string]bool{}
	for i, v := range attrSpellings {
		q := groupRequest{key: "cg-acme", ip: ips[i%len(ips)], attrs: map[string]string{"project": v, "team": attrSpellings[(i+3)%len(attrSpellings)]}}
		res, d := g.Reserve(ctx, q.request(g))
		if res == nil {
			t.Fatalf("refused: %+v", d)
		}
		for _, it := range res.items {
			debited[it.Limit.Name+"\x00"+it.Key] = true
		}
		if d, ok := res.Record(ctx); !ok {
			t.Fatalf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
	}
	if err := g.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := g.state.Load()
	gs, err := g.ledger.CountsBy(ctx, ledger.SpendQuery{Tenant: "acme", From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)},
		ledger.GroupBy{User: true, IP: true, Attrs: true})
	if err != nil {
		t.Fatal(err)
	}
	restored := map[string]bool{}
	for _, l := range st.limits {
		for i := range gs {
			w, ok := writtenOf(l, &gs[i])
			if !ok {
				t.Fatalf("limit %s: group %+v names none of its values", l.limit.Name, gs[i])
			}
			res := &Reservation{st: st, written: w, req: Request{Caller: &Caller{Tenant: "acme", User: gs[i].User}}}
			restored[l.limit.Name+"\x00"+l.key(res)] = true
		}
	}
	for k := range debited {
		if !restored[k] {
			t.Errorf("debited key %.200q: no restore writes it", k)
		}
	}
	for k := range restored {
		if !debited[k] {
			t.Errorf("restored key %.200q: no debit wrote it", k)
		}
	}
}

// TestAttrLossAtkEntryRecordsKeys: a 5,000-byte attribute value and an
// address that is no address keep the request's entry: the ledger stores
// it, with the keys' values bounded, and the attributes no limit names
// are not recorded.
func TestAttrLossAtkEntryRecordsKeys(t *testing.T) {
	ctx := context.Background()
	g, _ := groupGate(t, "{name: per-project, dimensions: [tenant, ip, attr.project], unit: requests, rate: 10, period: 24h}", true)
	long := strings.Repeat("v", 5000)
	q := groupRequest{key: "cg-acme", ip: strings.Repeat("x", 5000), attrs: map[string]string{"project": long, "other": long}}
	r := q.request(g)
	r.ID = "long-attr"
	res, d := g.Reserve(ctx, r)
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	if d, ok := res.Record(ctx); !ok {
		t.Fatalf("record: %+v", d)
	}
	res.Settle(ctx, Charge{Usage: unitUsage, Cost: 1_000, HTTPStatus: 200})
	if err := g.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e, ok, err := g.ledger.Lookup(ctx, "long-attr")
	if err != nil || !ok {
		t.Fatalf("the entry of a request of a 5,000-byte attribute: %v %v", ok, err)
	}
	if len(e.KeyIP) > maxKeyValue || !strings.HasPrefix(e.KeyAttrs, "project=vvv") || len(e.KeyAttrs) > maxKeyValue+len("project=") ||
		strings.Contains(e.KeyAttrs, "other") {
		t.Errorf("entry key ip %d bytes, key attrs %.60q (%d bytes); want each at most a key's value, project only", len(e.KeyIP), e.KeyAttrs, len(e.KeyAttrs))
	}
}

// FuzzKeyText: for any value, the ledger's text of its written form (as
// an entry records it) is text the ledger stores (UTF-8 without NUL), and
// reads back as the written form, byte for byte.
func FuzzKeyText(f *testing.F) {
	for _, v := range attrSpellings {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		w := writtenValue(v)
		s := ledgerText(w)
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			t.Fatalf("ledgerText(%q) = %q: not text the ledger stores", w, s)
		}
		if got := keyText(s); got != w {
			t.Fatalf("keyText(ledgerText(%q)) = %q", w, got)
		}
	})
}

// TestKeyRecordAllocations: what an entry records of a request's address
// and attributes costs it one allocation when their values are written
// as they are (an IPv4 address, plain attribute values: the usual case),
// and none when no limit is keyed by them.
func TestKeyRecordAllocations(t *testing.T) {
	req := Request{IP: "203.0.113.7", Attributes: map[string]string{"project": "search-indexer", "team": "core"}}
	k := keyDims{ip: true, attrs: []string{"project", "team"}}
	if n := testing.AllocsPerRun(1000, func() { k.record(&req) }); n > 1 {
		t.Errorf("an address and two plain attributes recorded in %.0f allocations, want at most 1", n)
	}
	none := keyDims{}
	if n := testing.AllocsPerRun(1000, func() { none.record(&req) }); n != 0 {
		t.Errorf("no limit keyed by them: %.0f allocations, want 0", n)
	}
}
