package control

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// The operations of the admin API: each validates its input, writes one
// transaction (the entity and its audit record) and returns the entity as
// stored.

// CreateTenant creates a tenant. Its name must be new, to the database and
// to the config file; its plan one the running configuration knows when
// the configuration applies limits or budgets by plan (see Plans).
func (p *Plane) CreateTenant(ctx context.Context, actor string, e *Entity) (*Entity, error) {
	e.Kind, e.Source = KindTenant, "api"
	if e.Tenant == "" {
		e.Tenant = e.Name
	}
	if e.Name != "" && e.Name != e.Tenant {
		return nil, invalid("name and tenant differ")
	}
	e.Name = e.Tenant
	if err := checkName("name", e.Name); err != nil {
		return nil, err
	}
	if p.fromConfig(e.Name) {
		return nil, fmt.Errorf("%w: tenant %q is declared in the config file", ErrConflict, e.Name)
	}
	e.ID = e.Name
	if err := p.prepare(e); err != nil {
		return nil, err
	}
	err := p.store.write(ctx, Change{Actor: actor, Action: "create", Detail: e}, func(tx *sql.Tx) ([]*Entity, error) {
		if _, err := p.store.get(ctx, tx, KindTenant, e.ID); err == nil {
			return nil, fmt.Errorf("%w: tenant %q already exists", ErrConflict, e.Name)
		}
		if err := p.checkPlan(e.Plan); err != nil {
			return nil, err
		}
		return []*Entity{e}, nil
	})
	return e, err
}

// CreateMember creates a team or a user inside an existing tenant.
func (p *Plane) CreateMember(ctx context.Context, actor string, e *Entity) (*Entity, error) {
	e.Source = "api"
	if err := checkName("name", e.Name); err != nil {
		return nil, err
	}
	if e.Team != "" || e.User != "" || e.Plan != "" {
		return nil, invalid("a %s has no team, user or plan of its own", e.Kind)
	}
	e.ID = newID(string(e.Kind) + "_")
	if err := p.prepare(e); err != nil {
		return nil, err
	}
	err := p.store.write(ctx, Change{Actor: actor, Action: "create", Detail: e}, func(tx *sql.Tx) ([]*Entity, error) {
		if err := p.tenantExists(ctx, tx, e.Tenant); err != nil {
			return nil, err
		}
		return []*Entity{e}, nil
	})
	return e, err
}

// tenantExists checks that tenant is the database's or the config file's.
func (p *Plane) tenantExists(ctx context.Context, tx *sql.Tx, tenant string) error {
	if tenant == "" {
		return invalid("tenant is required")
	}
	if p.fromConfig(tenant) {
		return nil
	}
	if _, err := p.store.get(ctx, tx, KindTenant, tenant); err != nil {
		if strings.Contains(err.Error(), "not found") {
			return invalid("tenant %q does not exist", tenant)
		}
		return err
	}
	return nil
}

// member finds a key's team or user by name within tenant; a name that
// only another tenant has is named as such.
func (p *Plane) member(ctx context.Context, tx *sql.Tx, kind Kind, tenant, name string) error {
	if name == "" {
		return nil
	}
	if !plainText(name) {
		return invalid("%s %q does not exist in tenant %q", kind, name, tenant)
	}
	if _, err := p.store.byName(ctx, tx, kind, tenant, name); err == nil {
		return nil
	} else if !strings.Contains(err.Error(), "not found") {
		return err
	}
	var other string
	err := tx.QueryRowContext(ctx, p.store.q("SELECT tenant FROM control_entities WHERE kind = ? AND (name = ? OR id = ?) LIMIT 1"), string(kind), name, name).Scan(&other)
	if err == nil && other != tenant {
		return invalid("%s %q belongs to tenant %q, not to tenant %q", kind, name, other, tenant)
	}
	return invalid("%s %q does not exist in tenant %q", kind, name, tenant)
}

// CreateKey creates a key and returns it with its secret, which is shown
// this once: only its hash is stored.
func (p *Plane) CreateKey(ctx context.Context, actor string, e *Entity) (*Entity, string, error) {
	e.Kind, e.Source = KindKey, "api"
	if e.Name != "" || e.Plan != "" {
		return nil, "", invalid("a key has no name or plan of its own (its tenant has the plan)")
	}
	now := time.Now()
	if e.ExpiresAt != nil && !e.ExpiresAt.After(now) {
		return nil, "", invalid("expires_at %s is in the past", e.ExpiresAt.Format(time.RFC3339))
	}
	e.ID = newID("key_")
	secret := newSecret()
	e.hash, e.Prefix = hashHex(secret), secret[:12]
	if err := p.prepare(e); err != nil {
		return nil, "", err
	}
	err := p.store.write(ctx, Change{Actor: actor, Action: "create", Detail: e}, func(tx *sql.Tx) ([]*Entity, error) {
		if err := p.tenantExists(ctx, tx, e.Tenant); err != nil {
			return nil, err
		}
		if err := p.member(ctx, tx, KindTeam, e.Tenant, e.Team); err != nil {
			return nil, err
		}
		if err := p.member(ctx, tx, KindUser, e.Tenant, e.User); err != nil {
			return nil, err
		}
		return []*Entity{e}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return e, secret, nil
}

// prepare sets the defaults of a new entity and validates it.
func (p *Plane) prepare(e *Entity) error {
	e.Active = true
	e.RevokedAt = nil
	if e.Budgets == nil {
		e.Budgets = []Budget{}
	}
	if e.Limits == nil {
		e.Limits = []Limit{}
	}
	for i := range e.Budgets {
		e.Budgets[i].Generation, e.Budgets[i].ResetAt = 0, nil
		e.Budgets[i].RaisedUSD, e.Budgets[i].RaisedUntil = "", nil
	}
	if e.Tenant != "" {
		if err := checkName("tenant", e.Tenant); err != nil {
			return err
		}
	}
	return e.validate(time.Now())
}

func hashHex(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// Get reads an entity; a tenant is named by its name, the others by id.
// A tenant the config file declares comes back read-only.
func (p *Plane) Get(ctx context.Context, kind Kind, id string) (*Entity, error) {
	if kind == KindTenant {
		if e := p.configEntity(id); e != nil {
			return e, nil
		}
	}
	return p.store.get(ctx, p.store.db, kind, id)
}

// List reads a page of entities; the config file's tenants come first on
// the first page of tenants.
func (p *Plane) List(ctx context.Context, q Query) ([]*Entity, error) {
	return p.store.List(ctx, q)
}

// Patch is an update: the fields given replace the entity's.
type Patch struct {
	Plan      *string            `json:"plan"`
	Budgets   *[]Budget          `json:"budgets"`
	Limits    *[]Limit           `json:"limits"`
	Models    *[]string          `json:"models"`
	Routes    *[]string          `json:"routes"`
	Metadata  *map[string]string `json:"metadata"`
	Active    *bool              `json:"active"`
	ExpiresAt *time.Time         `json:"expires_at"`
}

// Update applies patch to an entity.
func (p *Plane) Update(ctx context.Context, actor string, kind Kind, id string, patch Patch) (*Entity, error) {
	return p.modify(ctx, actor, "update", patch, kind, id, func(e *Entity) error {
		if patch.Plan != nil {
			if kind != KindTenant {
				return invalid("only a tenant has a plan")
			}
			// A tenant already on a plan the configuration does not
			// know (created before this check, or left by a reload)
			// keeps it until a PATCH names a plan: that one must be known.
			if err := p.checkPlan(*patch.Plan); err != nil {
				return err
			}
			e.Plan = *patch.Plan
		}
		if patch.Budgets != nil {
			// A budget kept keeps its counter (its generation), and its
			// raise while the raise still raises it (see keepsRaise).
			old := e.Budgets
			e.Budgets = *patch.Budgets
			for i := range e.Budgets {
				b := &e.Budgets[i]
				b.Generation, b.ResetAt, b.RaisedUSD, b.RaisedUntil = 0, nil, "", nil
				id := b.ID
				if id == "" {
					id = b.Period
					if id == "" {
						id = "day"
					}
				}
				for _, o := range old {
					if o.ID == id {
						b.Generation, b.ResetAt = o.Generation, o.ResetAt
						if keepsRaise(o, b.AmountUSD) {
							b.RaisedUSD, b.RaisedUntil = o.RaisedUSD, o.RaisedUntil
						}
					}
				}
			}
		}
		if patch.Limits != nil {
			e.Limits = *patch.Limits
		}
		if patch.Models != nil {
			e.Models = *patch.Models
		}
		if patch.Routes != nil {
			e.Routes = *patch.Routes
		}
		if patch.Metadata != nil {
			e.Metadata = *patch.Metadata
		}
		if patch.Active != nil {
			e.Active = *patch.Active
		}
		if patch.ExpiresAt != nil {
			if !patch.ExpiresAt.After(time.Now()) {
				return invalid("expires_at %s is in the past", patch.ExpiresAt.Format(time.RFC3339))
			}
			e.ExpiresAt = patch.ExpiresAt
		}
		return nil
	})
}

// keepsRaise tells whether budget o's raise outlives a PATCH that gives o
// the amount amount: a lowering is the operator's word on what the budget
// may spend from now on, and ends the raise (a raise kept would leave its
// larger amount in force until its end, the lowering answered 200 and of
// no effect); so does an amount at or above the raise's, which no longer
// raises it (kept, it would cap the budget below its amount). An amount
// that does not parse keeps it: validate refuses the PATCH.
func keepsRaise(o Budget, amount string) bool {
	if o.RaisedUSD == "" {
		return false
	}
	was, err1 := costmodel.ParseUSD(o.AmountUSD)
	now, err2 := costmodel.ParseUSD(amount)
	raised, err3 := costmodel.ParseUSD(o.RaisedUSD)
	if err1 != nil || err2 != nil || err3 != nil {
		return true
	}
	return now >= was && now < raised
}

// modify reads an entity in a write transaction, changes it with f,
// validates and stores it.
func (p *Plane) modify(ctx context.Context, actor, action string, detail any, kind Kind, id string, f func(*Entity) error) (*Entity, error) {
	if kind == KindTenant && p.fromConfig(id) {
		return nil, fmt.Errorf("%w: tenant %q", ErrReadOnly, id)
	}
	var out *Entity
	err := p.store.write(ctx, Change{Actor: actor, Action: action, Detail: detail}, func(tx *sql.Tx) ([]*Entity, error) {
		e, err := p.store.get(ctx, tx, kind, id)
		if err != nil {
			return nil, err
		}
		if e.RevokedAt != nil {
			return nil, fmt.Errorf("%w: key %q is revoked", ErrConflict, id)
		}
		if err := f(e); err != nil {
			return nil, err
		}
		if err := e.validate(time.Now()); err != nil {
			return nil, err
		}
		out = e
		return []*Entity{e}, nil
	})
	return out, err
}

// Rotate gives a key a new secret; the old one stays valid for grace.
func (p *Plane) Rotate(ctx context.Context, actor, id string, grace time.Duration) (*Entity, string, error) {
	if grace < 0 || grace > 30*24*time.Hour {
		return nil, "", invalid("grace must be from 0 to 720h")
	}
	secret := newSecret()
	e, err := p.modify(ctx, actor, "rotate", map[string]string{"grace": grace.String()}, KindKey, id, func(e *Entity) error {
		e.oldHash, e.oldUntil = e.hash, time.Now().Add(grace)
		if grace == 0 {
			e.oldHash, e.oldUntil = "", time.Time{}
		}
		e.hash, e.Prefix = hashHex(secret), secret[:12]
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return e, secret, nil
}

// Revoke ends a key at once (its secret, and a rotated one in its grace
// period).
func (p *Plane) Revoke(ctx context.Context, actor, id string) (*Entity, error) {
	return p.modify(ctx, actor, "revoke", nil, KindKey, id, func(e *Entity) error {
		now := time.Now().UTC()
		e.RevokedAt, e.Active = &now, false
		e.oldHash, e.oldUntil = "", time.Time{}
		return nil
	})
}

// ResetBudget starts a budget's counter anew.
func (p *Plane) ResetBudget(ctx context.Context, actor string, kind Kind, id, budget string) (*Entity, error) {
	return p.modify(ctx, actor, "reset_budget", map[string]string{"budget": budget}, kind, id, func(e *Entity) error {
		b := findBudget(e, budget)
		if b == nil {
			return fmt.Errorf("%w: %s %q has no budget %q", ErrNotFound, kind, id, budget)
		}
		now := time.Now().UTC()
		b.Generation, b.ResetAt = b.Generation+1, &now
		return nil
	})
}

// RaiseBudget makes a budget amount_usd until until.
func (p *Plane) RaiseBudget(ctx context.Context, actor string, kind Kind, id, budget, amount string, until time.Time) (*Entity, error) {
	if !until.After(time.Now()) {
		return nil, invalid("until %s is in the past", until.Format(time.RFC3339))
	}
	if _, err := parseAmount("amount_usd", amount); err != nil {
		return nil, err
	}
	return p.modify(ctx, actor, "raise_budget", map[string]any{"budget": budget, "amount_usd": amount, "until": until}, kind, id, func(e *Entity) error {
		b := findBudget(e, budget)
		if b == nil {
			return fmt.Errorf("%w: %s %q has no budget %q", ErrNotFound, kind, id, budget)
		}
		u := until.UTC()
		b.RaisedUSD, b.RaisedUntil = amount, &u
		return nil
	})
}

func findBudget(e *Entity, id string) *Budget {
	for i := range e.Budgets {
		if e.Budgets[i].ID == id {
			return &e.Budgets[i]
		}
	}
	return nil
}

// Audit reads a page of the audit log.
func (p *Plane) Audit(ctx context.Context, q AuditQuery) ([]AuditEntry, error) {
	return p.store.Audit(ctx, q)
}
