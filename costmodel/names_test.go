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
		{ParamIs, "ParamIs", "NUM", "num", true},
		{ParamIs, "ParamIs", "page.size", "page_size", true},
		{ParamIs, "ParamIs", "page size", "page_size", true},
		{ParamIs, "ParamIs", "ſize", "size", true}, // U+017F folds to s
		{ParamIs, "ParamIs", "sizes", "size", false},
		{ParamIs, "ParamIs", "siz", "size", false},
		{ParamIs, "ParamIs", "page-size", "page_size", false},
		{ParamIs, "ParamIs", "@", "`", false},
		{formKeyIs, "formKeyIs", "params[num]", "params.num", true},
		{formKeyIs, "formKeyIs", "Params[NUM]", "params.num", true},
		{formKeyIs, "formKeyIs", "params.num", "params.num", true},
		{formKeyIs, "formKeyIs", "queries[0][size]", "queries.0.size", true},
		{formKeyIs, "formKeyIs", "params[num", "params.num", true}, // PHP: params_num
		{formKeyIs, "formKeyIs", "params[num", "params.nu", false},
		{ParamIs, "ParamIs", "page[size", "page_size", true}, // PHP reads an unclosed [ as _
		{ParamIs, "ParamIs", "page[size]", "page_size", false},
		{formKeyIs, "formKeyIs", "params[num]x", "params.num", false},
		{formKeyIs, "formKeyIs", "params", "params.num", false},
	} {
		if got := c.f(c.a, c.b); got != c.want {
			t.Errorf("%s(%q, %q) = %v, want %v", c.fn, c.a, c.b, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		_ = HeaderIs("X_Credits", "X-Credits") || ParamIs("ſize", "size") || formKeyIs("params[num]", "params.num")
	}); n != 0 {
		t.Errorf("%v allocations to compare names, want 0", n)
	}
}
