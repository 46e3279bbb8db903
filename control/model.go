package control

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/ledger"
)

// Kind is an entity's kind.
type Kind string

// The kinds of entity, from the widest level to the narrowest.
const (
	KindTenant Kind = "tenant"
	KindTeam   Kind = "team"
	KindUser   Kind = "user"
	KindKey    Kind = "key"
)

// ErrInvalid marks an entity or a request the control plane refuses (the
// admin API's 400); ErrNotFound one it does not know (404); ErrConflict
// one that clashes with what exists (409); ErrReadOnly a change to an
// entity the configuration file declares (409).
var (
	ErrInvalid   = errors.New("invalid")
	ErrNotFound  = errors.New("not found")
	ErrConflict  = errors.New("conflict")
	ErrReadOnly  = errors.New("declared in the config file: read-only through the API")
	ErrStoreDown = errors.New("the control plane's database is unavailable")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Budget is a spend cap of an entity: AmountUSD (an exact decimal) per
// Period (day from UTC midnight, week, a UTC calendar month, or a rolling
// duration such as "72h").
type Budget struct {
	// ID names the budget within its entity; default its period.
	ID        string `json:"id,omitempty"`
	AmountUSD string `json:"amount_usd"`
	Period    string `json:"period,omitempty"`
	// SoftPercent, 1 to 99, sends an alert when spend crosses it, besides
	// the configured thresholds. 0 for none.
	SoftPercent int `json:"soft_percent,omitempty"`
	// Generation is advanced by a reset: the budget's counter starts
	// anew. Read-only.
	Generation int `json:"generation"`
	// ResetAt is when the budget was last reset, nil for never: after a
	// loss of the limiter store's data, its counter is restored from the
	// ledger's spend since then. Read-only.
	ResetAt *time.Time `json:"reset_at,omitempty"`
	// RaisedUSD replaces AmountUSD until RaisedUntil (a temporary raise).
	RaisedUSD   string     `json:"raised_amount_usd,omitempty"`
	RaisedUntil *time.Time `json:"raised_until,omitempty"`
}

// Limit is a rate limit of an entity, as a configured limit reads it.
type Limit struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm,omitempty"`
	Unit      string `json:"unit,omitempty"`
	Rate      int64  `json:"rate,omitempty"`
	RateUSD   string `json:"rate_usd,omitempty"`
	Period    string `json:"period"`
	Burst     int64  `json:"burst,omitempty"`
	Mode      string `json:"mode,omitempty"`
}

// Entity is a tenant, team, user or key of the control plane.
type Entity struct {
	ID   string `json:"id"`
	Kind Kind   `json:"kind"`
	// Tenant is the tenant's name (a tenant's own name for a tenant);
	// Name a team's or user's name, unique within its tenant.
	Tenant string `json:"tenant"`
	Name   string `json:"name,omitempty"`
	// Team and User are a key's team and user, by name; empty for none.
	Team string `json:"team,omitempty"`
	User string `json:"user,omitempty"`
	// Plan is a tenant's plan: the configured limits of that plan apply.
	Plan     string            `json:"plan,omitempty"`
	Budgets  []Budget          `json:"budgets"`
	Limits   []Limit           `json:"limits"`
	Models   []string          `json:"models,omitempty"`
	Routes   []string          `json:"routes,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Active   bool              `json:"active"`
	// ExpiresAt ends the entity's keys' validity; nil for never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// RevokedAt is when a key was revoked; nil while it is not.
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Prefix is the start of a key's secret, to recognise it.
	Prefix string `json:"prefix,omitempty"`
	// Source is "api", or "config" for what the config file declares.
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// hash is a key's SHA-256 (hex); oldHash the previous one, valid
	// until oldUntil (a rotation's grace period).
	hash, oldHash string
	oldUntil      time.Time
	seq           int64
}

// names of tenants, teams and users: they name limiter keys and limits,
// so they are short and plain.
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

func checkName(field, s string) error {
	if !nameRE.MatchString(s) {
		return invalid("%s %q: want 1 to 63 of a-z, 0-9, '_', '.', '-', starting with a letter or digit", field, s)
	}
	return nil
}

// maxList bounds the entries of lists an entity holds.
const maxList = 64

// validate checks what an entity carries (budgets, limits, lists) and
// compiles it, so that what is stored always compiles.
func (e *Entity) validate(now time.Time) error {
	if len(e.Budgets) > 16 || len(e.Limits) > 16 {
		return invalid("at most 16 budgets and 16 limits per %s", e.Kind)
	}
	if len(e.Models) > maxList || len(e.Routes) > maxList || len(e.Metadata) > maxList {
		return invalid("at most %d models, routes and metadata entries", maxList)
	}
	for k, v := range e.Metadata {
		if len(k) > 128 || len(v) > 1024 {
			return invalid("metadata %q: keys up to 128 bytes, values up to 1024", k)
		}
	}
	if !ledger.ValidKeyText(e.Plan) {
		return invalid("plan: UTF-8 text without NUL, at most %d bytes (the ledger records it with every request)", ledger.MaxKeyField)
	}
	for i, m := range e.Models {
		if m == "" || len(m) > 128 {
			return invalid("models[%d]: 1 to 128 characters", i)
		}
	}
	for i, r := range e.Routes {
		if len(r) < 2 || len(r) > 256 || r[0] != '/' {
			return invalid("routes[%d]: a path such as /v1/chat/completions or /u/search", i)
		}
	}
	seen := map[string]bool{}
	for i := range e.Budgets {
		b := &e.Budgets[i]
		if b.Period == "" {
			b.Period = "day"
		}
		if b.ID == "" {
			b.ID = b.Period
		}
		if err := checkName(fmt.Sprintf("budgets[%d].id", i), b.ID); err != nil {
			return err
		}
		if seen[b.ID] {
			return invalid("budgets[%d].id %q: given twice (two budgets of one period need ids of their own)", i, b.ID)
		}
		seen[b.ID] = true
		if _, err := parseAmount(fmt.Sprintf("budgets[%d].amount_usd", i), b.AmountUSD); err != nil {
			return err
		}
		if _, _, err := gate.ParseBudgetPeriod(b.Period); err != nil {
			return invalid("budgets[%d].%s", i, err)
		}
		if b.SoftPercent < 0 || b.SoftPercent > 99 {
			return invalid("budgets[%d].soft_percent: from 1 to 99, or 0 for none", i)
		}
		if b.RaisedUSD != "" {
			if _, err := parseAmount(fmt.Sprintf("budgets[%d].raised_amount_usd", i), b.RaisedUSD); err != nil {
				return err
			}
			if b.RaisedUntil == nil {
				return invalid("budgets[%d].raised_until: required with raised_amount_usd", i)
			}
		}
	}
	for i, l := range e.Limits {
		if err := checkName(fmt.Sprintf("limits[%d].name", i), l.Name); err != nil {
			return err
		}
		if seen["limit:"+l.Name] {
			return invalid("limits[%d].name %q: given twice", i, l.Name)
		}
		seen["limit:"+l.Name] = true
	}
	if _, err := e.level(); err != nil {
		return err
	}
	return nil
}

// maxAmount bounds a budget: a million dollars a period, in nano-dollars,
// far from int64's end so that sums cannot overflow.
const maxAmount = costmodel.NanoUSD(1_000_000 * 1e9)

func parseAmount(field, s string) (costmodel.NanoUSD, error) {
	n, err := costmodel.ParseUSD(s)
	switch {
	case err != nil:
		return 0, invalid("%s %q: want a decimal string such as \"1.00\"", field, s)
	case n <= 0:
		return 0, invalid("%s %q: must be positive", field, s)
	case n > maxAmount:
		return 0, invalid("%s %q: at most %s", field, s, maxAmount)
	}
	return n, nil
}

// levelName is how the entity names itself in limit names: a key by its
// id, the others by their name.
func (e *Entity) levelName() string {
	if e.Kind == KindKey || e.Kind == KindTenant {
		if e.Kind == KindTenant {
			return e.Tenant
		}
		return e.ID
	}
	return e.Name
}

// level compiles the entity's budgets, limits and lists for the gate; nil
// when it carries none.
func (e *Entity) level() (*gate.Level, error) {
	if len(e.Budgets) == 0 && len(e.Limits) == 0 && len(e.Models) == 0 && len(e.Routes) == 0 {
		return nil, nil
	}
	lv := &gate.Level{Kind: string(e.Kind), Name: e.levelName(), Models: e.Models, Routes: e.Routes}
	prefix := string(e.Kind) + "/" + e.levelName() + "/"
	for _, b := range e.Budgets {
		amount, err := parseAmount("amount_usd", b.AmountUSD)
		if err != nil {
			return nil, err
		}
		spec := gate.LevelLimitSpec{Name: prefix + b.ID, Tenant: e.Tenant, Entity: e.ID, ID: b.ID,
			KeySuffix: fmt.Sprintf("%s=%s:b=%s:g%d", e.Kind, e.ID, b.ID, b.Generation),
			Budget:    true, AmountNano: int64(amount), Period: b.Period, SoftPercent: b.SoftPercent}
		if b.ResetAt != nil {
			spec.Since = *b.ResetAt
		}
		ll, err := gate.CompileLevelLimit(spec)
		if err != nil {
			return nil, invalid("budget %q: %v", b.ID, err)
		}
		if b.RaisedUSD != "" && b.RaisedUntil != nil {
			raised, err := parseAmount("raised_amount_usd", b.RaisedUSD)
			if err != nil {
				return nil, err
			}
			spec.AmountNano = int64(raised)
			if ll.Raised, err = gate.CompileLevelLimit(spec); err != nil {
				return nil, invalid("budget %q: %v", b.ID, err)
			}
			ll.RaisedUntil = *b.RaisedUntil
		}
		lv.Limits = append(lv.Limits, ll)
	}
	for i, l := range e.Limits {
		period, err := time.ParseDuration(l.Period)
		if err != nil || period <= 0 {
			return nil, invalid("limits[%d].period %q: want a duration such as 1m", i, l.Period)
		}
		lc := config.LimitConfig{Algorithm: l.Algorithm, Unit: l.Unit, Rate: l.Rate, Period: period, Burst: l.Burst, Mode: l.Mode}
		if lc.Algorithm == "" {
			lc.Algorithm = "token_bucket"
		}
		if lc.Unit == "usd" {
			n, err := parseAmount(fmt.Sprintf("limits[%d].rate_usd", i), l.RateUSD)
			if err != nil {
				return nil, err
			}
			lc.RateUSD = config.USD(n)
		} else if l.Rate <= 0 {
			return nil, invalid("limits[%d].rate: a positive number of %s per period", i, l.Unit)
		}
		if l.Mode != "" && l.Mode != "enforce" && l.Mode != "shadow" {
			return nil, invalid("limits[%d].mode: enforce or shadow", i)
		}
		ll, err := gate.CompileLevelLimit(gate.LevelLimitSpec{Name: prefix + l.Name, Tenant: e.Tenant, Entity: e.ID, ID: l.Name,
			KeySuffix: fmt.Sprintf("%s=%s:l=%s", e.Kind, e.ID, l.Name), Limit: lc})
		if err != nil {
			return nil, invalid("limits[%d]: %v", i, err)
		}
		lv.Limits = append(lv.Limits, ll)
	}
	return lv, nil
}

// usable tells whether the entity admits requests at now.
func (e *Entity) usable(now time.Time) bool {
	return e.Active && e.RevokedAt == nil && (e.ExpiresAt == nil || now.Before(*e.ExpiresAt))
}

// newID returns prefix and 12 random hex digits.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newSecret returns a key's secret: "cgk_" and 32 random bytes in hex.
func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "cgk_" + hex.EncodeToString(b[:])
}
