package costmodel

import (
	"os"
	"strings"
	"testing"
)

// Cold-text benchmarks: ours, pkoukk/tiktoken-go (the baseline) and
// tiktoken-go/tokenizer, counting the same text in the same run. None of
// them caches: every iteration tokenizes the whole text. Compare ns/op as
// ratios; the tests check that the three give the same count.
func benchTexts(b *testing.B) map[string]string {
	b.Helper()
	prose, err := os.ReadFile("testdata/prose_contract.md")
	if err != nil {
		b.Fatal(err)
	}
	code, err := os.ReadFile("encoder.go")
	if err != nil {
		b.Fatal(err)
	}
	multi := strings.Repeat("Ünïcödé façade naïve café résumé Ελληνικά Русский текст العربية हिन्दी お誕生日おめでとう 你好世界。", 20)
	return map[string]string{"prose": string(prose), "code": string(code), "multilingual": multi}
}

func BenchmarkCountText(b *testing.B) {
	texts := benchTexts(b)
	loadEncoders()
	for _, enc := range []string{EncodingO200k, EncodingCl100k} {
		for _, name := range []string{"prose", "code", "multilingual"} {
			s := texts[name]
			ours := encoderFor(enc)
			base := oracle(b, enc)
			alt := oracle2(b, enc)
			tokens := ours.Count(s)
			if n := len(base.EncodeOrdinary(s)); n != tokens {
				b.Fatalf("%s %s: ours %d, pkoukk %d", enc, name, tokens, n)
			}
			b.Run(enc+"/"+name+"/costmodel", func(b *testing.B) {
				b.SetBytes(int64(len(s)))
				b.ReportAllocs()
				start := cpuTime()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						ours.Count(s)
					}
				})
				reportCPU(b, start)
				b.ReportMetric(float64(tokens), "tokens/op")
			})
			b.Run(enc+"/"+name+"/pkoukk", func(b *testing.B) {
				b.SetBytes(int64(len(s)))
				b.ReportAllocs()
				start := cpuTime()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						base.EncodeOrdinary(s)
					}
				})
				reportCPU(b, start)
				b.ReportMetric(float64(tokens), "tokens/op")
			})
			b.Run(enc+"/"+name+"/tiktoken-go-tokenizer", func(b *testing.B) {
				b.SetBytes(int64(len(s)))
				b.ReportAllocs()
				start := cpuTime()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						alt.Count(s)
					}
				})
				reportCPU(b, start)
				b.ReportMetric(float64(tokens), "tokens/op")
			})
		}
	}
}
