package costmodel

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

// TestUsageTapReadsAsParseUsage: the tap, fed an answer in pieces of
// every size, reads the usage ParseUsage reads from the whole, and no
// usage where ParseUsage reads none or two.
func TestUsageTapReadsAsParseUsage(t *testing.T) {
	responses := map[string]bool{"nested-usage": true, "escaped-name": true}
	for name, doc := range map[string]string{
		"chat":          `{"id":"c","choices":[{"message":{"content":"a \"usage\":{\"prompt_tokens\":1} }]},"}}],"usage":{"prompt_tokens":10,"completion_tokens":4000,"completion_tokens_details":{"reasoning_tokens":3900}}}`,
		"nested-usage":  `{"output":[{"usage":{"input_tokens":1,"output_tokens":1}}],"usage":{"input_tokens":45000,"output_tokens":3000}}`,
		"escaped-name":  `{"x":[1,[2,{"y":"}"}]],"\u0075sage" : {"input_tokens":7,"output_tokens":8} }`,
		"case":          `{"USAGE":{"prompt_tokens":5,"completion_tokens":6},"model":"m"}`,
		"two":           `{"usage":{"prompt_tokens":5,"completion_tokens":6},"Usage":{"prompt_tokens":1,"completion_tokens":1}}`,
		"null":          `{"usage":null}`,
		"none":          `{"choices":[]}`,
		"last-no-comma": `{"a":"b","usage":{"prompt_tokens":3,"completion_tokens":4}}`,
	} {
		kind := ChatCompletions
		if responses[name] {
			kind = Responses
		}
		want, werr := ParseUsage(kind, []byte(doc))
		for size := 1; size <= len(doc); size++ {
			var tap UsageTap
			for i := 0; i < len(doc); i += size {
				tap.Write([]byte(doc[i:min(i+size, len(doc))]))
			}
			got, ok := tap.Usage(kind)
			if ok != (werr == nil) || got != want {
				t.Fatalf("%s, pieces of %d: tap read %+v, %v; ParseUsage %+v, %v", name, size, got, ok, want, werr)
			}
		}
	}
}

// FuzzUsageTap: on any input the tap does not panic, and on a valid JSON
// answer a usage it reads, in two pieces split anywhere, is ParseUsage's.
func FuzzUsageTap(f *testing.F) {
	f.Add([]byte(`{"choices":[{"text":"}\"{"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`), 7)
	f.Add([]byte(`{"usage":{"input_tokens":3},"USAGE":null}`), 3)
	f.Add([]byte(`[{"usage":{"prompt_tokens":1}}]`), 1)
	f.Fuzz(func(t *testing.T, data []byte, cut int) {
		cut = min(max(cut, 0), len(data))
		var tap UsageTap
		tap.Write(data[:cut])
		tap.Write(data[cut:])
		got, ok := tap.Usage(ChatCompletions)
		if !ok || !json.Valid(data) {
			return
		}
		want, err := ParseUsage(ChatCompletions, data)
		if err != nil || got != want {
			t.Fatalf("tap read %+v; ParseUsage %+v, %v", got, want, err)
		}
	})
}

// TestUsageTapAtkManyUsageMembers: an answer of a million top-level usage
// members (an upstream's, past the proxy's 8 MiB capture) keeps none of
// them: two are ambiguous, and the tap's memory stays within one value's
// bound however many follow.
func TestUsageTapAtkManyUsageMembers(t *testing.T) {
	member := []byte(`"usage":{"prompt_tokens":1,"completion_tokens":1,"pad":"` + strings.Repeat("x", 1000) + `"},`)
	var tap UsageTap
	tap.Write([]byte(`{`))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 100_000 { // 100 MB of answer
		tap.Write(member)
	}
	tap.Write([]byte(`"x":1}`))
	runtime.GC()
	runtime.ReadMemStats(&after)
	if _, ok := tap.Usage(ChatCompletions); ok {
		t.Fatal("a usage read from an answer of many usage members")
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 4<<20 {
		t.Fatalf("the tap holds %d bytes more after 100,000 usage members", grew)
	}
}
