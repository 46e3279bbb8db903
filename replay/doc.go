// Package replay answers "what would this policy have done to last week's
// traffic?" before a policy is published.
//
// A Writer, owned by the gate, records the policy input of each request
// whose policies were evaluated, with the decision taken and the request's
// estimated cost, to a capture log: size-bounded, rotated files of JSON
// lines under data_dir/capture. Run evaluates a candidate policy directory
// against every captured input, on the fast path and on OPA's evaluator
// alone (a differential test on real traffic: any disagreement is an
// error), and reports which decisions change: by transition (allow to soft,
// soft to hard, ...), by policy, by tenant, with sample inputs and the
// money the changed decisions represent.
//
// Callers are recorded as the ledger keeps them: tenant, user and key id,
// never a key.
package replay
