package config

import (
	"math"
	"time"

	"github.com/costgate/costgate/weighted"
)

// LeaseConfig makes a limit or budget leased: each replica takes slices
// of a key's allowance from Redis and spends them in process (see
// weighted.Leased). Absent, the limit is strict: every decision asks Redis.
type LeaseConfig struct {
	// MaxShare is the most of the limit's capacity one replica holds
	// unspent per key, in (0, 1]; a lease is never larger. Required.
	MaxShare float64 `yaml:"max_share"`
	// TTL is how long a lease lives before its unspent part goes back;
	// default 2s, at most 1h. A lease on a window also ends with it.
	TTL time.Duration `yaml:"ttl"`
}

// Mode names a limit's consistency: "leased" or "strict".
func (l *LeaseConfig) Mode() string {
	if l == nil {
		return "strict"
	}
	return "leased"
}

// Weighted is the lease policy for a limit of capacity units: at most
// MaxShare of them, at least one. A nil config is no lease.
func (l *LeaseConfig) Weighted(capacity int64) weighted.Lease {
	if l == nil || capacity < 1 {
		return weighted.Lease{}
	}
	m := int64(math.Floor(l.MaxShare * float64(capacity)))
	return weighted.Lease{Max: min(max(m, 1), capacity), TTL: l.TTL}
}

// validate reports what is wrong with l at path p (limits[i].lease).
func (l *LeaseConfig) validate(p string, concurrency bool, bad func(path, format string, args ...any)) {
	if l == nil {
		return
	}
	if concurrency {
		bad(p, "a concurrency limit cannot be leased: its slots are held while requests run, not spent")
	}
	if !(l.MaxShare > 0 && l.MaxShare <= 1) {
		bad(p+".max_share", "must be more than 0 and at most 1, such as 0.1, not %v", l.MaxShare)
	}
	if l.TTL < 0 || l.TTL > time.Hour {
		bad(p+".ttl", "must be between 0 (the default, 2s) and 1h, not %s", l.TTL)
	}
}
