package costmodel_test

import (
	"testing"

	"github.com/costgate/costgate/costmodel"
)

// TestUnitsAtkJSONArrayAsNumber: a JavaScript upstream reads a count
// given as an array by the array's text: parseInt(req.body.num) and
// Number(req.body.num) are 1000 for [1000], ["1000"] and [[1000]], and
// parseInt is 1000 for [1000, 5] and ["1000 results"]. Counted by its
// elements alone, each of them was priced as one unit. A field that
// holds a count reads an array as the larger of both; one that the rule
// declares a list (list: true) counts its elements, whatever they say.
func TestUnitsAtkJSONArrayAsNumber(t *testing.T) {
	j := unitsAtkJSON
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"number in an array", j(`{"credits":[1000]}`), 1000},
		{"string in an array", j(`{"credits":["1000"]}`), 1000},
		{"string with spaces", j(`{"credits":[" 1000 "]}`), 1000},
		{"array in an array", j(`{"credits":[[1000]]}`), 1000},
		{"deeper", j(`{"credits":[[[["1000"],2]]]}`), 1000},
		{"first of two", j(`{"credits":[1000,5]}`), 1000},
		{"digits before text", j(`{"credits":["1000 results"]}`), 1000},
		{"plus sign", j(`{"credits":["+1000"]}`), 1000},
		{"exponent", j(`{"credits":["1e3"]}`), 1000},
		{"number with an exponent", j(`{"credits":[1e3]}`), 1000},
		{"fraction", j(`{"credits":[999.5]}`), 1000},
		{"hexadecimal", j(`{"credits":["0x3e8"]}`), 1000},
		{"escaped digits", j(`{"credits":["\u0031000"]}`), 1000},
		{"more elements than the first says", j(`{"credits":[1,1,1,1]}`), 4},
		{"negative first", j(`{"credits":[-1000,2]}`), 2},
		{"text first", j(`{"credits":["abc",1000]}`), 2},
		{"empty first", j(`{"credits":[[],1000]}`), 2},
		{"empty", j(`{"credits":[]}`), 0},
	})
	// Past the largest count, the reading saturates, and a price that
	// cannot be represented is refused.
	unitsAtkCheck(t, unitsAtkRule, []unitsAtkCase{
		{"digits past int64", j(`{"credits":["99999999999999999999999 results"]}`), -1},
	})
	capped := costmodel.Rule{PerUnit: 10, Units: &costmodel.Source{JSON: "num", Default: 10, Max: 100}}
	unitsAtkCheck(t, capped, []unitsAtkCase{
		{"capped", j(`{"num":[1000]}`), 100},
	})
	// A complexity's page size is such a count too.
	plain, err := unitsAtkSearch.Estimate(j(`{"query":"golang","size":100}`))
	if err != nil {
		t.Fatal(err)
	}
	unitsAtkCheck(t, unitsAtkSearch, []unitsAtkCase{
		{"page size in an array", j(`{"query":"golang","size":[100]}`), plain.Usage.Units},
	})

	list := costmodel.Rule{PerUnit: 10, Units: &costmodel.Source{JSON: "addresses", Default: 1, Max: 1000, List: true}}
	for _, c := range []struct {
		body string
		want int64
	}{
		{`{"addresses":["10 Downing St, London","1 Infinite Loop, Cupertino"]}`, 2},
		{`{"addresses":[98765]}`, 1},
		{`{"addresses":["1000"]}`, 1},
		{`{"addresses":7}`, 7}, // not a list: read as the count it says
	} {
		est, err := list.Estimate(j(c.body))
		if err != nil || est.Usage.Units != c.want {
			t.Errorf("list %s: %d units (err %v), want %d", c.body, est.Usage.Units, err, c.want)
		}
	}
	if err := (costmodel.Rule{PerUnit: 1, Units: &costmodel.Source{Query: "n", List: true}}).Validate(); err == nil {
		t.Error("list: true without a json field validated")
	}
}
