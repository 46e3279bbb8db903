package costmodel

import "testing"

func TestNames(t *testing.T) {
	for _, c := range []struct {
		f        func(a, b string) bool
		fn, a, b string
		want     bool
	}{
		{HeaderIs, "HeaderIs", "X_Credits", "X-Credits", true},
		{HeaderIs, "HeaderIs", "x-credits", "X-CREDITS", true},
		{HeaderIs, "HeaderIs", "idempotency_key", "idempotency-key", true},
		{HeaderIs, "HeaderIs", "X-Credit", "X-Credits", false},
		{HeaderIs, "HeaderIs", "X.Credits", "X-Credits", false},
		{paramIs, "paramIs", "NUM", "num", true},
		{paramIs, "paramIs", "page.size", "page_size", true},
		{paramIs, "paramIs", "page size", "page_size", true},
		{paramIs, "paramIs", "ſize", "size", true}, // U+017F folds to s
		{paramIs, "paramIs", "sizes", "size", false},
		{paramIs, "paramIs", "siz", "size", false},
		{paramIs, "paramIs", "page-size", "page_size", false},
		{paramIs, "paramIs", "@", "`", false},
		{formKeyIs, "formKeyIs", "params[num]", "params.num", true},
		{formKeyIs, "formKeyIs", "Params[NUM]", "params.num", true},
		{formKeyIs, "formKeyIs", "params.num", "params.num", true},
		{formKeyIs, "formKeyIs", "queries[0][size]", "queries.0.size", true},
		{formKeyIs, "formKeyIs", "params[num", "params.num", true}, // PHP: params_num
		{formKeyIs, "formKeyIs", "params[num", "params.nu", false},
		{paramIs, "paramIs", "page[size", "page_size", true}, // PHP reads an unclosed [ as _
		{paramIs, "paramIs", "page[size]", "page_size", false},
		{formKeyIs, "formKeyIs", "params[num]x", "params.num", false},
		{formKeyIs, "formKeyIs", "params", "params.num", false},
	} {
		if got := c.f(c.a, c.b); got != c.want {
			t.Errorf("%s(%q, %q) = %v, want %v", c.fn, c.a, c.b, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = HeaderIs("X_Credits", "X-Credits") || paramIs("ſize", "size") || formKeyIs("params[num]", "params.num")
	}); n != 0 {
		t.Errorf("%v allocations to compare names, want 0", n)
	}
}
