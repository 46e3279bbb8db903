package policies

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestCombine(t *testing.T) {
	hard := func(p string, status int) ruling {
		return ruling{policy: p, verdict: verdict{outcome: Hard, status: status, reason: "r-" + p}}
	}
	soft := func(p string, f Friction) ruling {
		return ruling{policy: p, verdict: verdict{outcome: Soft, reason: "r-" + p, friction: f}}
	}
	allow := func(p string) ruling { return ruling{policy: p, verdict: verdict{outcome: Allow}} }
	shadow := func(r ruling) ruling { r.shadow = true; return r }
	tests := []struct {
		name string
		in   []ruling
		want Decision
	}{
		{"nothing", nil, Decision{Outcome: Allow}},
		{"all allow", []ruling{allow("a"), allow("b")}, Decision{Outcome: Allow}},
		{"hard over soft", []ruling{soft("a", Friction{DelayMS: 5}), hard("b", 429)},
			Decision{Outcome: Hard, Status: 429, Reason: "r-b", Policy: "b"}},
		{"first hard by id on equal status", []ruling{hard("a", 429), hard("b", 429)},
			Decision{Outcome: Hard, Status: 429, Reason: "r-a", Policy: "a"}},
		{"403 over 402 over 429", []ruling{hard("a", 429), hard("b", 402), hard("c", 403), hard("d", 402)},
			Decision{Outcome: Hard, Status: 403, Reason: "r-c", Policy: "c"}},
		{"402 over 429", []ruling{hard("a", 429), hard("b", 402)},
			Decision{Outcome: Hard, Status: 402, Reason: "r-b", Policy: "b"}},
		{"friction merged", []ruling{
			soft("a", Friction{DelayMS: 100, CapMaxTokens: 800, Warning: "w-a"}),
			allow("b"),
			soft("c", Friction{DelayMS: 300, CapMaxTokens: 200, DowngradeModel: "m-c"}),
			soft("d", Friction{DelayMS: 50, CapMaxTokens: 500, DowngradeModel: "m-d", Warning: "w-d"}),
		}, Decision{Outcome: Soft, Reason: "r-a", Policy: "a",
			Friction: Friction{DelayMS: 300, CapMaxTokens: 200, DowngradeModel: "m-c", Warning: "w-a; w-d"},
			Sources:  Sources{DelayMS: "c", CapMaxTokens: "c", DowngradeModel: "c", Warning: []string{"a", "d"}}}},
		{"ties go to the first policy by id", []ruling{
			soft("a", Friction{DelayMS: 5, CapMaxTokens: 9}), soft("b", Friction{DelayMS: 5, CapMaxTokens: 9, DowngradeModel: "m"}),
		}, Decision{Outcome: Soft, Reason: "r-a", Policy: "a", Friction: Friction{DelayMS: 5, CapMaxTokens: 9, DowngradeModel: "m"},
			Sources: Sources{DelayMS: "a", CapMaxTokens: "a", DowngradeModel: "b"}}},
		{"cap 0 means no cap", []ruling{soft("a", Friction{}), soft("b", Friction{CapMaxTokens: 7})},
			Decision{Outcome: Soft, Reason: "r-a", Policy: "a", Friction: Friction{CapMaxTokens: 7}, Sources: Sources{CapMaxTokens: "b"}}},
		{"shadow never enforced, allows not recorded", []ruling{
			allow("a"), shadow(hard("a", 403)), shadow(allow("b")), shadow(soft("c", Friction{DelayMS: 9})),
		}, Decision{Outcome: Allow, Shadow: []Shadow{
			{Policy: "a", Outcome: Hard, Status: 403, Reason: "r-a"},
			{Policy: "c", Outcome: Soft, Reason: "r-c", Friction: Friction{DelayMS: 9}},
		}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := combine(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("combine =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestDecodeVerdict(t *testing.T) {
	tests := []struct {
		json    string
		want    verdict
		wantErr string
	}{
		{`{"outcome":"allow"}`, verdict{outcome: Allow}, ""},
		{`{"outcome":"allow","reason":"fine"}`, verdict{outcome: Allow, reason: "fine"}, ""},
		{`{"outcome":"hard","status":402,"reason":"budget"}`, verdict{outcome: Hard, status: 402, reason: "budget"}, ""},
		{`{"outcome":"soft","friction":{"delay_ms":10,"cap_max_tokens":256,"downgrade_model":"m","warning":"w"}}`,
			verdict{outcome: Soft, friction: Friction{DelayMS: 10, CapMaxTokens: 256, DowngradeModel: "m", Warning: "w"}}, ""},
		{`{"outcome":"hard"}`, verdict{}, "needs status"},
		{`{"outcome":"hard","status":500}`, verdict{}, "not 429, 402 or 403"},
		{`{"outcome":"hard","status":429.5}`, verdict{}, "not a 64-bit integer"},
		{`{"outcome":"soft","status":429}`, verdict{}, "only a hard decision"},
		{`{"outcome":"allow","friction":{}}`, verdict{}, "only a soft decision"},
		{`{"outcome":"block"}`, verdict{}, "not allow, soft or hard"},
		{`{"status":403}`, verdict{}, "outcome"},
		{`{"outcome":"soft","friction":{"cap_max_token":5}}`, verdict{}, "unknown field"},
		{`{"outcome":"soft","friction":{"cap_max_tokens":0}}`, verdict{}, "not a positive"},
		{`{"outcome":"soft","friction":{"delay_ms":-1}}`, verdict{}, "negative"},
		{`{"outcome":"soft","friction":{"downgrade_model":""}}`, verdict{}, "empty"},
		{`{"outcome":"soft","friction":[]}`, verdict{}, "want an object"},
		{`{"outcome":"allow","why":"x"}`, verdict{}, "unknown field"},
		{`"allow"`, verdict{}, "want an object"},
		{`{"outcome":1}`, verdict{}, "want a string"},
	}
	for _, tc := range tests {
		t.Run(tc.json, func(t *testing.T) {
			got, err := decodeVerdict(decodeJSON(t, tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("decodeVerdict = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func decodeJSON(t testing.TB, s string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDecisionString(t *testing.T) {
	tests := []struct {
		d    Decision
		want string
	}{
		{Decision{Outcome: Allow}, "allow"},
		{Decision{Outcome: Hard, Status: 402, Policy: "budget", Reason: "budget spent"}, "hard 402 (budget): budget spent"},
		{Decision{Outcome: Soft, Policy: "plans", Reason: "slow", Friction: Friction{DelayMS: 750, CapMaxTokens: 1024, DowngradeModel: "m", Warning: "w"},
			Shadow: []Shadow{{Policy: "x"}}}, `soft (plans): slow [delay_ms=750 cap_max_tokens=1024 downgrade_model=m warning="w"] +1 shadow`},
	}
	for _, tc := range tests {
		if got := tc.d.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestInputJSONListsNeverNull(t *testing.T) {
	b, err := json.Marshal(&Input{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"limits":[]`) || !strings.Contains(string(b), `"spend":[]`) {
		t.Fatalf("JSON %s has null lists", b)
	}
	in, err := DecodeInput(b)
	if err != nil || in.Value().Compare((&Input{}).Value()) != 0 {
		t.Fatalf("round trip: %v", err)
	}
}
