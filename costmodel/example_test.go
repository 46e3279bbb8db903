package costmodel_test

import (
	"fmt"
	"net/url"

	"github.com/costgate/costgate/costmodel"
)

func ExampleEstimator_Estimate() {
	e, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		panic(err)
	}
	body := []byte(`{"model":"gpt-4o-mini","messages":[
		{"role":"system","content":"You are terse."},
		{"role":"user","content":"Name three prime numbers."}],
		"max_tokens":50}`)
	est, err := e.Estimate(costmodel.ChatCompletions, body)
	if err != nil {
		panic(err)
	}
	fmt.Println(est.Encoding, est.Usage.InputTokens, est.Usage.OutputTokens, est.Cost)
	// Output: o200k_base 20 50 $0.000033000
}

func ExampleParseUsage() {
	u, err := costmodel.ParseUsage(costmodel.AnthropicMessages, []byte(`{"usage":{"input_tokens":12,"cache_read_input_tokens":1000,"output_tokens":40}}`))
	if err != nil {
		panic(err)
	}
	e, _ := costmodel.NewEstimator(costmodel.Config{})
	fmt.Println(u.InputTokens, u.CachedInputTokens, u.OutputTokens, e.Cost("claude-sonnet-4-5", u))
	// Output: 1012 1000 40 $0.000936000
}

func ExampleEstimator_NewStreamMeter() {
	e, _ := costmodel.NewEstimator(costmodel.Config{})
	m := e.NewStreamMeter(costmodel.ChatCompletions, "gpt-4o")
	// The stream is cut before its usage report: the text seen is counted.
	m.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n"))
	m.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"}}]}\n\n"))
	u, reported := m.Usage()
	fmt.Println(u.OutputTokens, reported)
	// Output: 2 false
}

func ExampleRule_Estimate() {
	r := costmodel.Rule{
		Unit:    "complexity points",
		PerCall: 1_000_000, // $0.001
		PerUnit: 100_000,   // $0.0001
		Complexity: &costmodel.Complexity{
			Query:    costmodel.Source{Query: "q"},
			PageSize: costmodel.Source{Query: "num", Default: 10},
			Offset:   costmodel.Source{Query: "start"},
		},
	}
	if err := r.Validate(); err != nil {
		panic(err)
	}
	for _, q := range []string{"q=golang", "q=go*+AND+/ra.e/&num=50&start=500"} {
		v, _ := url.ParseQuery(q)
		est, _ := r.Estimate(costmodel.GenericRequest{Method: "GET", Path: "/search", Query: v})
		fmt.Println(est.Usage.Units, est.Cost)
	}
	// Output:
	// 3 $0.001300000
	// 41 $0.005100000
}

func ExamplePrice_Cost() {
	// gpt-4o: $2.50 per million input tokens, $1.25 cached, $10 output.
	p := costmodel.Price{Input: 2_500_000_000, CachedInput: 1_250_000_000, Output: 10 * costmodel.Dollar}
	u := costmodel.Usage{InputTokens: 10_000, CachedInputTokens: 8_000, OutputTokens: 500}
	fmt.Println(p.Cost(u))
	// Output: $0.020000000
}

func ExampleEstimator_CountText() {
	e, _ := costmodel.NewEstimator(costmodel.Config{})
	fmt.Println(e.CountText("gpt-4o", "tiktoken is great!"), e.CountText("gpt-4", "tiktoken is great!"))
	// Output: 6 6
}
