package costgate.policies.search_pagination_test

import data.costgate.policies.search_pagination as sp
import data.costgate.testing.input_with

page(p) := input_with({}, {"route": "search", "upstream": "brave", "model": "", "page": p}, [], [])

test_first_pages_free if {
	every p in [0, 1, 5] {
		sp.decision == {"outcome": "allow"} with input as page(p)
	}
}

test_delay_grows_per_page if {
	sp.decision.friction == {"delay_ms": 100} with input as page(6)
	sp.decision.friction == {"delay_ms": 1900} with input as page(24)
}

test_delay_tops_out_at_2s if {
	every p in [25, 60, 100] {
		d := sp.decision with input as page(p)
		d.friction.delay_ms == 2000
	}
}

test_past_100_refused if {
	d := sp.decision with input as page(101)
	d.status == 403
}

test_search_upstream_on_other_route if {
	inp := input_with({}, {"route": "web", "upstream": "search", "page": 30}, [], [])
	d := sp.decision with input as inp
	d.outcome == "soft"
}

test_other_apis_ignored if {
	sp.decision == {"outcome": "allow"} with input as input_with({}, {"route": "chat", "page": 500}, [], [])
}
