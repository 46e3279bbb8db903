package costmodel

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestOutputAbove checks the guard's count against its definition, the
// tokenizer's count of all the text streamed so far, event by event, for
// text with and without places to split, on each encoding: it never says
// the output is at or below a mark it has passed, it counts at most a word
// more than there is, and it leaves the meter's own Usage as it was.
func TestOutputAbove(t *testing.T) {
	est, err := NewEstimator(Config{})
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields("the cost of a token is what the model charges for it, and 12345 budgets hold many; naïve café 東京 ok")
	for _, model := range []string{"gpt-4o-mini", "gpt-4", "claude-haiku-4-5"} {
		for _, joiner := range []string{" ", "", "\n"} {
			t.Run(fmt.Sprintf("%s/%q", model, joiner), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				guarded, plain := est.NewStreamMeter(ChatCompletions, model), est.NewStreamMeter(ChatCompletions, model)
				var text strings.Builder
				mark := int64(0)
				for i := range 600 {
					piece := words[rng.IntN(len(words))]
					if i > 0 {
						piece = joiner + piece
					}
					text.WriteString(piece)
					ev := fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", piece)
					guarded.Write([]byte(ev))
					plain.Write([]byte(ev))
					exact := est.CountText(model, text.String())
					out, above := guarded.OutputAbove(mark)
					if !above && exact > mark {
						t.Fatalf("event %d: %d tokens streamed, and OutputAbove(%d) says not above", i, exact, mark)
					}
					if above && (out < exact || out > exact+2+exact/50) {
						t.Fatalf("event %d: OutputAbove says %d tokens; %d were streamed", i, out, exact)
					}
					if above {
						mark = out + int64(rng.IntN(40)) // the next increment
					}
				}
				gu, _ := guarded.Usage()
				pu, _ := plain.Usage()
				if gu != pu {
					t.Errorf("the guard changed Usage: %+v, without it %+v", gu, pu)
				}
			})
		}
	}
}
