// Package policies decides, per request, whether costgate allows a request,
// serves it with friction (a soft limit) or refuses it (a hard limit), from
// operator-written OPA Rego policies. Policies are compiled and prepared once
// per load, swapped atomically on reload, tested like code, and evaluated in
// microseconds.
//
// # Input
//
// Every policy sees the same input document, built by the proxy for each
// request: see Input and schema/input.schema.json. Money is integer
// nano-dollars, tokens are integer counts, and there are no floats. Every
// reference a policy makes to input is type-checked against the schema when
// the policy is loaded, so a misspelt field is a load error with its file
// and line.
//
// # Convention
//
// A policy is a Rego v1 package costgate.policies.<id> (the id is a single
// path segment) in a .rego file of the policy directory; several files may
// share one package. It defines at least one of:
//
//   - decision: the enforced verdict, an object with
//     outcome ("allow", "soft" or "hard"), status (429, 402 or 403, only and
//     always with hard), reason (a string) and friction (only with soft; an
//     object with any of delay_ms, cap_max_tokens, downgrade_model and
//     warning). See schema/decision.schema.json. An undefined decision is an
//     allow. Anything else (an unknown field, a hard decision without status,
//     a string where a number belongs) is an evaluation error naming the
//     policy, never a silent allow.
//   - shadow_decision: same shape, evaluated and recorded in
//     Decision.Shadow but never enforced. It lets an operator try a stricter
//     rule beside the enforced one.
//
// A package whose package-scope METADATA annotation says
//
//	# METADATA
//	# custom:
//	#   shadow: true
//
// is a shadow policy: its decision is recorded, never enforced, unless it
// is promoted: Set.Promote enforces its decision rule for one version of
// its source (PolicyInfo.SourceSHA256, the digest of its files and of the
// library files), so that a changed file leaves it in shadow again.
//
// Packages elsewhere (for example costgate.lib.plans) are libraries that
// policies may import. Files ending in _test.rego hold Rego unit tests
// (rules named test_*); they are run by Load, which rejects the whole
// directory when one fails, and by Test, as `opa test` runs them.
//
// Statuses mean: 429, a rate or quota limit, worth retrying after the limit
// resets; 402, a budget is spent, worth retrying after the budget period
// resets; 403, forbidden to this caller whatever the time (a model not in
// the plan, an abusive client), not worth retrying.
//
// # Combination
//
// Every enforced decision of every policy is combined, in policy id order:
//
//   - the outcome is the most severe one: hard over soft over allow;
//   - when several policies refuse, the most severe status wins (403 over
//     402 over 429: a forbidden request must not be told to retry later),
//     then the lowest policy id; its reason and id are the Decision's;
//   - when the outcome is soft, the reason and id are those of the first
//     soft policy by id, and friction is merged: the largest delay_ms, the
//     smallest cap_max_tokens, the downgrade_model of the first policy by id
//     that downgrades, and every warning, joined with "; " in id order;
//     Decision.Sources names the policy of each merged action;
//   - shadow decisions that are not allow are listed in Decision.Shadow in
//     policy id order, with what they would have done.
//
// An enforced policy that fails to evaluate makes Decide return an error,
// and the Decision returned with it is that of the other policies: an
// input that breaks one policy does not switch off the rest. By default
// the failed policy itself allows (a broken policy does not take the API
// down). A package whose METADATA says
//
//	# METADATA
//	# custom:
//	#   on_error: deny
//
// refuses instead: its failure is a hard 403 decision ("policy ID could
// not decide on this request"), combined with the others as any refusal,
// so that a caller who can make its input break the policy (an attribute
// that is not the number it converts) does not pass its hard limit. A
// shadow policy that fails is recorded in Decision.Shadow with its error.
//
// # Loading, reloading, testing
//
// Load (or LoadDir) parses every .rego file, compiles and type-checks the
// policies, prepares each decision rule once, compiles the fast path (below)
// and runs the Rego tests; a Set is immutable. An Engine holds the active
// Set atomically: Reload and ReloadDir swap in a new Set only when it loads
// completely, and keep the last good one otherwise. (The server watches the
// policy directory, subdirectories included, with proxy.Server.Watch.)
// Check and Test back `costgate policy check` and `costgate policy test`.
//
// # Performance
//
// Rules are compiled at load time into a small program over the Go Input
// (see fast.go), which decides the example policies in a few microseconds
// and about 15 allocations, against 100 to 300 µs and 900 to 2000
// allocations for rego.Eval. It covers the Rego that costgate policies are
// made of; a policy using anything else runs on OPA's evaluator
// (PolicyInfo.Fast and Slow say which and why), and any input the program
// cannot decide exactly as OPA does is handed to OPA's evaluator. The
// decision is always the one the Rego source says.
package policies
