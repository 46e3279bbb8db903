# METADATA
# title: Search deep pagination
# description: |
#   A metered search API is cheap on its first pages and is scraped through
#   its deep ones. Pages 1 to 5 are free of friction; from page 6 each page
#   adds 100 ms of delay, up to 2 s from page 25; past page 100 the request
#   is refused (403): no human reads that far.
package costgate.policies.search_pagination

search if input.request.route == "search"

search if input.request.upstream == "search"

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 403, "reason": "pagination deeper than 100 pages is not allowed"} if {
	search
	input.request.page > 100
} else := {"outcome": "soft", "reason": "deep pagination", "friction": {"delay_ms": 2000, "warning": "deep pagination is slowed down"}} if {
	search
	input.request.page >= 25
} else := {"outcome": "soft", "reason": "deep pagination", "friction": {"delay_ms": (input.request.page - 5) * 100}} if {
	search
	input.request.page > 5
}
