package config

import (
	"math"
	"slices"
	"strings"
	"time"
)

// RegionsConfig splits every budget among regions that each run their own
// Redis and share the ledger's PostgreSQL (see gate.Regions). Absent,
// budgets are counted in the one Redis.
type RegionsConfig struct {
	// Names are every region's name; the config's region must be one.
	Names []string `yaml:"names"`
	// Interval is how often this region rebalances its caps; default 10s.
	Interval time.Duration `yaml:"interval"`
	// MinShare is the least share of what is left of a budget that a
	// region's demand weighs; default 0.05.
	MinShare float64 `yaml:"min_share"`
}

func (r *RegionsConfig) validate(c *Config, bad func(path, format string, args ...any)) {
	if r == nil {
		return
	}
	switch {
	case len(r.Names) == 0:
		bad("regions.names", "required: every region's name, this one's included")
	case c.Region == "":
		bad("region", "required with regions: this replica's region, one of %s", strings.Join(r.Names, ", "))
	case !slices.Contains(r.Names, c.Region):
		bad("region", "%q is not one of regions.names (%s)", c.Region, strings.Join(r.Names, ", "))
	}
	if !strings.HasPrefix(c.Ledger.DSN, "postgres://") && !strings.HasPrefix(c.Ledger.DSN, "postgresql://") {
		bad("ledger.dsn", "regions share their budgets through PostgreSQL: a postgres:// URL is required")
	}
	if r.Interval < 0 {
		bad("regions.interval", "must not be negative")
	}
	if r.MinShare < 0 || r.MinShare > 1 || math.IsNaN(r.MinShare) {
		bad("regions.min_share", "must be between 0 and 1, not %v", r.MinShare)
	}
}
