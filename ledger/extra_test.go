package ledger

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRecordExtraRoundTrip: a spool record keeps the usage the entry's
// integer columns do not hold (web searches, containers, the tier, the
// speed...), estimated and actual, so that a ledger replayed from its
// spool after a crash bills and shows what the one that wrote it did.
func TestRecordExtraRoundTrip(t *testing.T) {
	r := sampleRecord("x")
	r.e.Estimated.WebSearchRequests, r.e.Estimated.ContainerGB, r.e.Estimated.Speed = 2, 64, "fast"
	r.e.Actual.CacheWrite1hTokens, r.e.Actual.AudioInputTokens, r.e.Actual.AudioOutputTokens = 5, 6, 7
	r.e.Actual.FileSearchCalls, r.e.Actual.ServiceTier, r.e.Actual.InferenceGeo = 3, "priority", "us"
	b := appendFrame(nil, &r)
	var got record
	if n, err := readFrame(b, &got, nil); err != nil || n != len(b) {
		t.Fatalf("readFrame: %d, %v", n, err)
	}
	if got != r {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
	}
	// A record without extra usage is the frame of earlier versions,
	// which this one reads.
	old := sampleRecord("y")
	if b := appendFrame(nil, &old); len(b) != len(appendFrame(nil, &old)) || strings.Contains(string(b), "{") {
		t.Fatalf("a record without extra usage carries some: %q", b)
	}
}

// TestExtraTextIsCutNotRefused: an upstream that names its service tier
// in 10 KB of invalid UTF-8 gets its entry stored, billed in full, the
// tier cut to maxExtraText bytes of valid text: what the upstream says is
// never a reason to lose the entry.
func TestExtraTextIsCutNotRefused(t *testing.T) {
	ctx := context.Background()
	l, err := Open(ctx, Config{Dir: t.TempDir(), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := sampleRecord("z").e
	r.Status, r.Actual, r.ActualCost, r.SettledAt = "", r.Estimated, 0, r.CreatedAt
	if err := l.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	s := Entry{RequestID: "z", HTTPStatus: 200, ActualCost: 99}
	s.Actual.InputTokens, s.Actual.ServiceTier = 5, strings.Repeat("\xff", 10<<10)
	if err := l.Settle(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e, ok, err := l.Lookup(ctx, "z")
	if err != nil || !ok {
		t.Fatalf("lookup: %v %v", ok, err)
	}
	if tier := e.Actual.ServiceTier; e.ActualCost != 99 || tier == "" || len(tier) > maxExtraText || !utf8.ValidString(tier) {
		t.Fatalf("entry %+v; want the cost 99 and the tier cut to valid text of at most %d bytes", e, maxExtraText)
	}
}

// TestExtraTextOnePath: an upstream's text is stored the same whether it
// went through the spool's record or straight to the store: invalid
// bytes are replaced before the cut, so cutting again changes nothing,
// and a rune is never split.
func TestExtraTextOnePath(t *testing.T) {
	for _, c := range []struct{ name, in string }{
		{"invalid bytes", strings.Repeat("\xff=", 100)},
		{"a rune across the cut", strings.Repeat("a", maxExtraText-1) + "é" + "tail"},
		{"three-byte runes", strings.Repeat("€", 40)},
		{"short", "flex"},
		{"empty", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := extraText(c.in)
			if len(s) > maxExtraText || !utf8.ValidString(s) {
				t.Fatalf("extraText = %q: %d bytes, valid %v", s, len(s), utf8.ValidString(s))
			}
			if again := extraText(s); again != s {
				t.Fatalf("cut again: %q, want %q", again, s)
			}
			if len(c.in) <= maxExtraText && utf8.ValidString(c.in) && s != c.in {
				t.Fatalf("a short valid text changed: %q", s)
			}
		})
	}
}

// TestRecordRequests: a spool record keeps the requests the limiter
// counted, none and many alike; a record of 1 ends where records of
// earlier versions end, and such a record, which names none, reads as 1.
func TestRecordRequests(t *testing.T) {
	for _, n := range []int64{0, 1, 60, 1 << 40} {
		r := sampleRecord("x")
		r.e.Requests = n
		b := appendFrame(nil, &r)
		var got record
		if _, err := readFrame(b, &got, nil); err != nil || got != r {
			t.Fatalf("%d requests: read back %+v, %v", n, got.e, err)
		}
	}
	one, none := sampleRecord("y"), sampleRecord("y")
	one.e.Requests = 1
	if a, b := appendFrame(nil, &one), appendFrame(nil, &none); len(a) >= len(b) {
		t.Fatalf("a record of 1 request is %d bytes, one of none %d: want it shorter, as earlier versions wrote it", len(a), len(b))
	}
	old := appendFrame(nil, &one) // the frame an earlier version wrote
	got := record{e: Entry{Requests: 9}}
	if _, err := readFrame(old, &got, nil); err != nil || got.e.Requests != 1 {
		t.Fatalf("an earlier version's record reads as %d requests, %v; want 1", got.e.Requests, err)
	}
}

// TestRecordKeyModelAndRoute: a spool record keeps the model and route
// the limiter keyed its request by, with any extra usage and requests
// before them; a record without them ends where earlier versions' end,
// and such a record reads as naming none (a reused record too).
func TestRecordKeyModelAndRoute(t *testing.T) {
	for _, c := range []struct{ model, route string }{{"gpt-4o", ""}, {"", "/v1/costgate/reserve"}, {"gpt-4o", "/x"}} {
		for _, requests := range []int64{1, 3} {
			r := sampleRecord("x")
			r.e.KeyModel, r.e.KeyRoute, r.e.Requests = c.model, c.route, requests
			b := appendFrame(nil, &r)
			var got record
			if _, err := readFrame(b, &got, nil); err != nil || got != r {
				t.Fatalf("%+v, %d requests: read back %+v, %v", c, requests, got.e, err)
			}
		}
	}
	plain, keyed := sampleRecord("y"), sampleRecord("y")
	plain.e.Requests, keyed.e.Requests, keyed.e.KeyModel = 1, 1, "gpt-4o"
	old := appendFrame(nil, &plain)
	if len(old) >= len(appendFrame(nil, &keyed)) {
		t.Fatalf("a record without a key model is not shorter than one with")
	}
	got := record{e: Entry{KeyModel: "stale", KeyRoute: "stale"}}
	if _, err := readFrame(old, &got, nil); err != nil || got.e.KeyModel != "" || got.e.KeyRoute != "" {
		t.Fatalf("a record without them reads as %q, %q, %v; want none", got.e.KeyModel, got.e.KeyRoute, err)
	}
}
