package costmodel

// Learnable tells whether est's output reservation may be a learned
// estimate instead of OutputCap times output_reserve: the request has
// output, asks for no audio output (priced apart), and is not a stream
// whose output costgate cannot fully count (Uncounted: a stream cut
// without a usage report is charged at least its reservation, which must
// then stay the worst case).
func (est Estimate) Learnable() bool {
	return est.OutputCap > 0 && est.Usage.AudioOutputTokens == 0 && !(est.Stream && est.Uncounted)
}

// WithOutput returns est reserving tokens output tokens: never below 0,
// never above what est reserves already (at most OutputCap), priced again
// at est.Model's price.
func (e *Estimator) WithOutput(est Estimate, tokens int64) Estimate {
	tokens = min(max(tokens, 0), est.Usage.OutputTokens, est.OutputCap)
	if tokens == est.Usage.OutputTokens {
		return est
	}
	est.Usage.OutputTokens = tokens
	est.Cost = e.Cost(est.Model, est.Usage)
	return est
}
