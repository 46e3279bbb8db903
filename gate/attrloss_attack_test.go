package gate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// project is acme's request (key cg-acme) with attribute project v.
func project(v string) groupRequest {
	return groupRequest{key: "cg-acme", attrs: map[string]string{"project": v}}
}

// from is acme's request (key cg-acme) from client address ip.
func from(ip string) groupRequest {
	return groupRequest{key: "cg-acme", ip: ip}
}

// attrLossCases are limits keyed by the caller and by a client address
// or an attribute, with two requests whose counters differ only in it.
var attrLossCases = []struct {
	name, dims string
	a, b       groupRequest
	algorithms []string
}{
	{"tenant and project", "[tenant, attr.project]", project("a"), project("b"), sharedAlgorithms},
	{"user and project", "[user, attr.project]", project("a"), project("b"), []string{"fixed_window"}},
	{"tenant, model and project", "[tenant, model, attr.project]", project("a"), project("b"), []string{"fixed_window"}},
	{"tenant and address", "[tenant, ip]", from("192.0.2.1"), from("192.0.2.2"), sharedAlgorithms},
	{"tenant and IPv6 /64", "[tenant, ip]", from("2001:db8:0:1::1"), from("2001:db8:0:2::1"), []string{"fixed_window"}},
	{"tenant and IPv4-mapped address", "[tenant, ip]", from("::ffff:192.0.2.1"), from("192.0.2.2"), []string{"fixed_window"}},
}

// TestAttrLossAtkLimitsHold: a limit keyed by the tenant and a project
// attribute (or the client address) of 10 requests a day. acme spends 6
// on project a and 3 on project b, and Redis then loses its data
// (FLUSHALL): a must be admitted the 4 left, b the 7 left, each restored
// apart from the ledger; after a second loss, none. Before, no entry
// recorded the address or the attributes, the limit was not restored,
// and each came back empty: 10 more admitted on each. On the embedded
// ledger and PostgreSQL.
func TestAttrLossAtkLimitsHold(t *testing.T) {
	for _, c := range attrLossCases {
		for _, algo := range c.algorithms {
			for _, store := range []string{"embedded", "postgres"} {
				t.Run(c.name+"/"+algo+"/"+store, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					g, srv := groupGate(t, fmt.Sprintf("{name: allowance, dimensions: %s, unit: requests, rate: 10, period: 24h, algorithm: %s}",
						c.dims, algo), store == "postgres")
					if n := spendGroupUntil(t, g, c.a, 6, 429); n != 6 {
						t.Fatalf("before the loss: %d admitted of 6", n)
					}
					if n := spendGroupUntil(t, g, c.b, 3, 429); n != 3 {
						t.Fatalf("before the loss: %d admitted of 3", n)
					}
					flushRedis(t, srv)
					if n := spendGroupUntil(t, g, c.a, 20, 429); n != 4 {
						t.Fatalf("after Redis lost its data: %d admitted of the 4 left of 10 on %+v", n, c.a)
					}
					if n := spendGroupUntil(t, g, c.b, 20, 429); n != 7 {
						t.Fatalf("after Redis lost its data: %d admitted of the 7 left of 10 on %+v", n, c.b)
					}
					flushRedis(t, srv)
					for _, q := range []groupRequest{c.a, c.b} {
						if n := spendGroupUntil(t, g, q, 20, 429); n > 0 {
							t.Fatalf("after Redis lost its data again: %d more admitted on %+v, spent", n, q)
						}
					}
				})
			}
		}
	}
}

// TestAttrLossAtkIPv6OnePrefixOneCounter: an IPv6 client's addresses in
// one /64 count on one counter of a per-address limit, and so must its
// restore: 6 requests from 2001:db8::1 and 3 from 2001:db8::ffff:2 (9 of
// 10), 2 from another /64; after FLUSHALL the /64 is admitted 1 more
// (from either address), the other 8. Before, both came back empty.
func TestAttrLossAtkIPv6OnePrefixOneCounter(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := groupGate(t, "{name: per-ip, dimensions: [tenant, ip], unit: requests, rate: 10, period: 24h}", store == "postgres")
			one, two, other := from("2001:db8::1"), from("2001:db8::ffff:2"), from("2001:db8:0:9::1")
			if n := spendGroupUntil(t, g, one, 6, 429) + spendGroupUntil(t, g, two, 3, 429) + spendGroupUntil(t, g, other, 2, 429); n != 11 {
				t.Fatalf("before the loss: %d admitted of 11", n)
			}
			flushRedis(t, srv)
			if n := spendGroupUntil(t, g, two, 20, 429) + spendGroupUntil(t, g, one, 20, 429); n != 1 {
				t.Fatalf("after Redis lost its data: %d admitted from the /64 that had 1 left", n)
			}
			if n := spendGroupUntil(t, g, other, 20, 429); n != 8 {
				t.Fatalf("after Redis lost its data: %d admitted from the other /64, which had 8 left", n)
			}
		})
	}
}

// attrSpellings are attribute values a caller may send to the gate's
// library API (the proxy refuses most): the key's delimiters, a hash tag,
// percent signs and what looks like the key's and the ledger's escapes,
// bytes that are not UTF-8 text, NUL, values of 5,000 bytes (hashed in
// the key) that differ only in their last byte.
var attrSpellings = []string{
	"x", "x:attr.project=y", "x=y", ":", "=", "{acme}", "}{", "%", "%3A", "%25", "%~", "%FF", "%00",
	"caf\xe9", "nul\x00byte", "\xff\xfe",
	strings.Repeat("p", 5000), strings.Repeat("p", 4999) + "q",
	strings.Repeat("\xff", 5000), strings.Repeat(":", 5000),
}

// TestAttrLossAtkAttributeSpellings: each of attrSpellings is a project
// of its own on a [tenant, attr.project] limit of 10 requests a day, and
// spends 1 to 5 of them (each request admitted and its entry stored:
// a 5,000-byte value must not make the ledger refuse the entry); after
// FLUSHALL each must be admitted exactly what it had left: restored on
// the counter it was debited on, no two merged. Before, each came back
// empty.
func TestAttrLossAtkAttributeSpellings(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := groupGate(t, "{name: per-project, dimensions: [tenant, attr.project], unit: requests, rate: 10, period: 24h}", store == "postgres")
			for i, v := range attrSpellings {
				if n := spendGroupUntil(t, g, project(v), 1+i%5, 429); n != 1+i%5 {
					t.Fatalf("before the loss: %d admitted of %d on project %.40q", n, 1+i%5, v)
				}
			}
			if err := g.ledger.Flush(context.Background()); err != nil {
				t.Fatalf("the ledger refused an entry: %v", err)
			}
			flushRedis(t, srv)
			for i, v := range attrSpellings {
				if n := spendGroupUntil(t, g, project(v), 20, 429); n != 10-(1+i%5) {
					t.Errorf("after Redis lost its data: %d admitted on project %.40q (%d bytes), which had %d left", n, v, len(v), 10-(1+i%5))
				}
			}
		})
	}
}

// TestAttrLossAtkManyValues: 300 projects spend 1 each of a
// [tenant, attr.project] limit of 1 request a day, among requests that
// carry another attribute (team) which a second limit names, so that the
// entries' recorded attributes differ in what the first limit does not
// key by; after FLUSHALL each project is refused and a new one admitted
// once. Before, every project was admitted again.
func TestAttrLossAtkManyValues(t *testing.T) {
	for _, store := range []string{"embedded", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			awayFromWindowEdge(t, 24*time.Hour)
			g, srv := groupGate(t, `{name: per-project, dimensions: [tenant, attr.project], unit: requests, rate: 1, period: 24h}
  - {name: per-team, dimensions: [tenant, attr.team], unit: requests, rate: 1000, period: 24h}`, store == "postgres")
			q := func(i int) groupRequest {
				return groupRequest{key: "cg-acme", attrs: map[string]string{"project": fmt.Sprint("p", i), "team": fmt.Sprint("t", i%7)}}
			}
			const projects = 300
			for i := range projects {
				if n := spendGroupUntil(t, g, q(i), 1, 429); n != 1 {
					t.Fatalf("before the loss: project %d refused", i)
				}
			}
			flushRedis(t, srv)
			admitted := 0
			for i := range projects {
				admitted += spendGroupUntil(t, g, q(i), 1, 429)
			}
			if admitted > 0 {
				t.Fatalf("after Redis lost its data: %d of %d spent projects admitted again", admitted, projects)
			}
			if n := spendGroupUntil(t, g, q(projects), 2, 429); n != 1 {
				t.Fatalf("after Redis lost its data: a new project admitted %d of its 1", n)
			}
		})
	}
}

// TestAttrLossAtkLedgerDown runs ledgerDownLoss (the ledger's database
// down between two losses, then a new process) on limits keyed by the
// tenant and a project, and by the tenant and the client address.
func TestAttrLossAtkLedgerDown(t *testing.T) {
	for _, c := range []struct {
		dims string
		q    groupRequest
	}{{"[tenant, attr.project]", project("a:b")}, {"[tenant, ip]", from("2001:db8::7")}} {
		for _, posture := range []string{"fail_closed", "fail_open"} {
			t.Run(c.dims+"/"+posture, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				ledgerDownLoss(t, "", fmt.Sprintf("{name: allowance, dimensions: %s, unit: requests, rate: 10, period: 24h, on_store_failure: %s}",
					c.dims, posture), posture, c.q, c.q)
			})
		}
	}
}

// TestAttrLossAtkRestartOnMemory: on the embedded default (the in-memory
// store, the embedded ledger in data_dir) a restart loses every counter;
// acme's 6 requests on project a and 3 from 192.0.2.1, on limits keyed by
// the tenant and each, come back from the ledger: 4 and 7 left. Before,
// 10 each.
func TestAttrLossAtkRestartOnMemory(t *testing.T) {
	awayFromWindowEdge(t, 24*time.Hour)
	open := onDataDir(t, `tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - {name: per-project, dimensions: [tenant, attr.project], unit: requests, rate: 10, period: 24h}
  - {name: per-ip, dimensions: [tenant, ip], unit: requests, rate: 10, period: 24h}
`)
	g := open()
	if n := spendGroupUntil(t, g, project("a"), 6, 429) + spendGroupUntil(t, g, from("192.0.2.1"), 3, 429); n != 9 {
		t.Fatalf("before the restart: %d admitted of 9", n)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g = open()
	defer g.Close()
	if n := spendGroupUntil(t, g, project("a"), 20, 429); n != 4 {
		t.Fatalf("after a restart: %d admitted on project a, which had 4 left", n)
	}
	if n := spendGroupUntil(t, g, from("192.0.2.1"), 20, 429); n != 7 {
		t.Fatalf("after a restart: %d admitted from 192.0.2.1, which had 7 left", n)
	}
}
