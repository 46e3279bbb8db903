package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
)

func TestGenericPath(t *testing.T) {
	cases := []struct {
		raw, want string // want "" means refused
	}{
		{"/u/gen/a/b", "/a/b"},
		{"/u/gen/", "/"},
		{"/u/gen", "/"},
		{"/u/gen/a/", "/a/"},
		{"/u/gen/a/./b/../c", "/a/c"},
		{"/u/gen/a//b", "/a/b"},
		{"/u/gen/a/..", "/"},
		{"/u/gen/a/b/.", "/a/b/"},
		{"/u/gen/%61%2E%2e", "/a.."}, // "a.." is no dot-segment
		{"/u/gen/q%3Fx%23y%25z", "/q?x#y%z"},
		{"/u/%67en/a", "/a"},
		{"/u/gen/..", ""},
		{"/u/gen/a/../..", ""},
		{"/u/gen/%2e%2e", ""},
		{"/u/gen/a%2fb", ""},
		{"/u/gen/a%5cb", ""},
		{`/u/gen/a\b`, ""},
		{"/u/gen/a%00", ""},
		{"/u/gen/a%1f", ""},
		{"/u/gen/%25%32%65", ""},
		{"/u/gen/..;x/a", ""},
		{"/u/gen/a%", ""},
		{"/u/other/a", ""},
		{"/v/gen/a", ""},
		{"u/gen/a", ""},
	}
	for _, c := range cases {
		got, err := genericPath(c.raw, "gen")
		if c.want == "" {
			if err == nil {
				t.Errorf("genericPath(%q) = %q, want it refused", c.raw, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("genericPath(%q) = %q, %v; want %q", c.raw, got, err, c.want)
		}
	}
}

// FuzzGenericPath: whatever the client writes after /u/gen, a path
// genericPath accepts is clean, reads the same when read again, and is the
// path the upstream receives under its base_url's path, never outside it;
// the price rule chosen for it is the rule of what the upstream receives.
func FuzzGenericPath(f *testing.F) {
	for _, s := range []string{
		"/expensive", "/x/../expensive", "//expensive", "/./expensive", "/../../admin",
		"/%2e%2e/admin", "/..%2fadmin", "/a%2fb", "/a%5cb", `/a\b`, "/a%00", "/%252e%252e/",
		"/a/b/..", "/a/./b//c/", "/%65xpensive", "/..;/x", "/q%3F%23", "/", "",
	} {
		f.Add(s)
	}
	cost := costmodel.Rule{PerCall: costmodel.NanoUSD(1)}
	expensive := costmodel.Rule{PerCall: costmodel.NanoUSD(1000)}
	cfg := config.UpstreamConfig{Name: "gen", Kind: "generic", Cost: &cost, Methods: []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"},
		Paths: []config.PathCost{{Prefix: "/expensive", Cost: expensive}}}
	u, err := newUpstream(cfg, "http://up.example/base")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, suffix string) {
		raw := "/u/gen" + suffix
		p, err := genericPath(raw, "gen")
		if err != nil {
			return
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "//") {
			t.Fatalf("genericPath(%q) = %q: not clean", raw, p)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == "." || seg == ".." || strings.ContainsAny(seg, "\\\x00") {
				t.Fatalf("genericPath(%q) = %q: segment %q", raw, p, seg)
			}
		}
		// Read again, as the upstream (or another costgate) would: the same.
		again, err := genericPath("/u/gen"+(&url.URL{Path: p}).EscapedPath(), "gen")
		if err != nil || again != p {
			t.Fatalf("genericPath(%q) = %q, but read again %q, %v", raw, p, again, err)
		}

		// Forward it, and read the URL the upstream is sent.
		in := httptest.NewRequest(http.MethodGet, "http://costgate.example/u/gen/", nil)
		x := &exchange{id: "req_fuzz", subpath: p}
		in = in.WithContext(context.WithValue(context.Background(), ctxKey{}, x))
		pr := &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
		u.rewrite(pr)
		sent, err := url.Parse(pr.Out.URL.String())
		if err != nil {
			t.Fatalf("forwarded URL %q: %v", pr.Out.URL.String(), err)
		}
		if sent.Path != "/base"+p {
			t.Fatalf("genericPath(%q) = %q, but the upstream receives %q", raw, p, sent.Path)
		}
		if c := path.Clean(sent.Path); c != "/base" && !strings.HasPrefix(c, "/base/") {
			t.Fatalf("genericPath(%q): the upstream receives %q, outside /base", raw, sent.Path)
		}
		if got, want := u.rule(strings.TrimPrefix(sent.Path, "/base")), u.rule(p); got != want {
			t.Fatalf("%q is priced by %+v, but the upstream receives %q, whose rule is %+v", raw, *want, sent.Path, *got)
		}
	})
}

// TestHeaderIs: a header name matches in any case and with '_' for '-',
// and only the whole name; reading a request's headers allocates nothing.
func TestHeaderIs(t *testing.T) {
	for _, c := range []struct {
		name string
		want bool
	}{
		{"X-Http-Method-Override", true}, {"x_http_method_override", true}, {"X_HTTP_Method_Override", true},
		{"X-Http-Method", true}, {"X-Method-Override", true}, {"X-Method_override", true},
		{"X-Http-Method-Overrid", false}, {"X-Http-Method-Overrides", false}, {"Content-Length", false},
		{"X-Http-Methodxoverride", false}, {"", false},
	} {
		if got := isMethodOverride(c.name); got != c.want {
			t.Errorf("isMethodOverride(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		name string
		want bool
	}{
		{"Idempotency-Key", true}, {"IDEMPOTENCY_KEY", true}, {"X-Idempotency-Key", true}, {"Idempotence-Token", true},
		{"X-Amzn-Idempotency-Token", true}, {"idempoten", true}, {"Idempotent", true},
		{"Idempotenc", true}, {"Idempote", false}, {"X-Request-Id", false}, {"", false},
	} {
		if got := isIdempotencyKey(c.name); got != c.want {
			t.Errorf("isIdempotencyKey(%q) = %v, want %v", c.name, got, c.want)
		}
	}
	h := http.Header{"Content-Type": {"a"}, "Authorization": {"b"}, "Accept-Encoding": {"c"}, "X-Forwarded-For": {"d"}, "Idempotency-Key": {"e"}}
	if n := testing.AllocsPerRun(100, func() {
		for name := range h {
			_ = isMethodOverride(name) || isIdempotencyKey(name)
		}
	}); n != 0 {
		t.Errorf("%v allocations to read a request's header names, want 0", n)
	}
}
