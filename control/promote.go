package control

// Promotion: a policy its files declare shadow is enforced on every
// replica once an operator acknowledges a replay of the captured traffic
// with it enforced. The replay's document (the report, the policy's and
// the set's source digests) is stored under a replay id with its SHA-256;
// the promotion names both, and holds for that source only. The
// promotions live in control_policy_modes, written with the version
// advanced, so that every replica's poll applies them to its gate.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
)

// ReplayMaxAge is how long a promotion replay can be acknowledged: the
// captured traffic it read is older than the traffic since.
const ReplayMaxAge = time.Hour

// ReplayDocument is what an operator acknowledges before a promotion: a
// replay of the captured traffic on the active policy set with one shadow
// policy enforced. Its SHA-256, as stored, is the acknowledgment.
type ReplayDocument struct {
	Policy string `json:"policy"`
	// PolicySHA256 is the policy's source digest, SetSHA256 the whole
	// set's (see policies.Set.SourceSHA256), when the replay ran.
	PolicySHA256 string    `json:"policy_sha256"`
	SetSHA256    string    `json:"set_sha256"`
	Since        string    `json:"since,omitempty"`
	Tenant       string    `json:"tenant,omitempty"`
	At           time.Time `json:"at"`
	Summary      Summary   `json:"summary"`
	// Report is the replay's report (replay.Report), as JSON.
	Report json.RawMessage `json:"report"`
}

// Summary is a replay report's totals, as the audit log keeps them.
type Summary struct {
	Records        int            `json:"records"`
	Replayed       int            `json:"replayed"`
	Changed        int            `json:"changed"`
	ChangedNanoUSD int64          `json:"changed_cost_nano_usd"`
	Transitions    map[string]int `json:"transitions"`
}

// PolicyReplay is a stored promotion replay.
type PolicyReplay struct {
	ID           string          `json:"replay_id"`
	Policy       string          `json:"policy"`
	PolicySHA256 string          `json:"policy_sha256"`
	SetSHA256    string          `json:"set_sha256"`
	ReportSHA256 string          `json:"report_sha256"`
	Document     json.RawMessage `json:"document"`
	Actor        string          `json:"actor"`
	CreatedAt    time.Time       `json:"created_at"`
}

// Promotion is a shadow policy enforced through the admin API.
type Promotion struct {
	Policy       string    `json:"policy"`
	PolicySHA256 string    `json:"policy_sha256"`
	ReplayID     string    `json:"replay_id"`
	ReportSHA256 string    `json:"report_sha256"`
	Actor        string    `json:"promoted_by"`
	At           time.Time `json:"promoted_at"`
}

// KindPolicy is the audit log's kind for policy replays, promotions and
// demotions; the entity is the policy id.
const KindPolicy Kind = "policy"

// RecordReplay stores doc under a new replay id with its SHA-256, and
// records it in the audit log.
func (p *Plane) RecordReplay(ctx context.Context, actor string, doc *ReplayDocument) (*PolicyReplay, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	r := &PolicyReplay{ID: newID("rpl_"), Policy: doc.Policy, PolicySHA256: doc.PolicySHA256, SetSHA256: doc.SetSHA256,
		ReportSHA256: hex.EncodeToString(sum[:]), Document: b, Actor: actor, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	s := p.store
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, storeErr(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO control_policy_replays (id, policy, policy_sha256, set_sha256, report_sha256, document, actor, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`), r.ID, r.Policy, r.PolicySHA256, r.SetSHA256, r.ReportSHA256, string(b), actor, micros(r.CreatedAt)); err != nil {
		return nil, storeErr(err)
	}
	if err := s.audit(ctx, tx, actor, "replay", doc.Policy, map[string]any{
		"replay_id": r.ID, "report_sha256": r.ReportSHA256, "policy_sha256": r.PolicySHA256, "set_sha256": r.SetSHA256, "summary": doc.Summary,
	}); err != nil {
		return nil, err
	}
	return r, storeErr(tx.Commit())
}

// audit records a change of policy in tx.
func (s *Store) audit(ctx context.Context, tx *sql.Tx, actor, action, policy string, detail any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO control_audit (at, actor, action, kind, entity, tenant, detail) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		micros(time.Now().UTC()), actor, action, string(KindPolicy), policy, "", string(b))
	return storeErr(err)
}

// Replay reads a stored promotion replay.
func (p *Plane) Replay(ctx context.Context, id string) (*PolicyReplay, error) {
	s := p.store
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	r := &PolicyReplay{ID: id}
	var (
		doc string
		at  int64
	)
	err := s.db.QueryRowContext(ctx, s.q(`SELECT policy, policy_sha256, set_sha256, report_sha256, document, actor, created_at
		FROM control_policy_replays WHERE id = ?`), id).Scan(&r.Policy, &r.PolicySHA256, &r.SetSHA256, &r.ReportSHA256, &doc, &r.Actor, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no replay %q", ErrNotFound, id)
	}
	if err != nil {
		return nil, storeErr(err)
	}
	r.Document, r.CreatedAt = json.RawMessage(doc), fromMicros(at)
	return r, nil
}

// Promote enforces the shadow policy id on every replica, from the
// replay replayID whose document's SHA-256 the operator acknowledges
// (ack). It is refused (ErrInvalid) without a replay id or an
// acknowledgment; (ErrConflict) for a replay of another policy, a digest
// that is not the replay's, a replay older than ReplayMaxAge or run on
// other policy sources than this replica's, a policy not declared shadow,
// or one promoted already; (ErrNotFound) for a policy this replica does
// not have. The promotion and its audit record are one transaction.
func (p *Plane) Promote(ctx context.Context, actor, id, replayID, ack string) (*Promotion, error) {
	if replayID == "" || ack == "" {
		return nil, invalid("replay_id and acknowledge_sha256 are required: run POST /admin/v1/policies/%s/promote/replay, read its report, and acknowledge its report_sha256", id)
	}
	set := p.gate.Policies()
	if set == nil {
		return nil, fmt.Errorf("%w: no policy is configured", ErrNotFound)
	}
	info, ok := set.Policy(id)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: no policy %q is loaded", ErrNotFound, id)
	case info.Promoted:
		return nil, fmt.Errorf("%w: policy %q is promoted already", ErrConflict, id)
	case !info.Shadow:
		return nil, fmt.Errorf("%w: policy %q is not a shadow policy: its files enforce it", ErrConflict, id)
	}
	r, err := p.Replay(ctx, replayID)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: no replay %q: run POST /admin/v1/policies/%s/promote/replay", ErrConflict, replayID, id)
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	switch {
	case r.Policy != id:
		return nil, fmt.Errorf("%w: replay %s is of policy %q, not %q", ErrConflict, replayID, r.Policy, id)
	case !hexEqual(ack, r.ReportSHA256):
		return nil, fmt.Errorf("%w: acknowledge_sha256 is not the SHA-256 of replay %s's report: read that report and acknowledge its report_sha256", ErrConflict, replayID)
	case now.Sub(r.CreatedAt) > ReplayMaxAge:
		return nil, fmt.Errorf("%w: replay %s is older than %s: replay again on the traffic captured since", ErrConflict, replayID, ReplayMaxAge)
	case r.PolicySHA256 != info.SourceSHA256:
		return nil, fmt.Errorf("%w: policy %q's source changed since replay %s (sha256 %s then, %s now): replay again", ErrConflict, id, replayID, r.PolicySHA256, info.SourceSHA256)
	case r.SetSHA256 != set.SourceSHA256():
		return nil, fmt.Errorf("%w: the policy files changed since replay %s: replay again", ErrConflict, replayID)
	}
	var doc ReplayDocument
	_ = json.Unmarshal(r.Document, &doc)
	pr := &Promotion{Policy: id, PolicySHA256: r.PolicySHA256, ReplayID: r.ID, ReportSHA256: r.ReportSHA256, Actor: actor, At: now.UTC().Truncate(time.Microsecond)}
	err = p.store.versioned(ctx, func(tx *sql.Tx, seq int64) error {
		var have string
		err := tx.QueryRowContext(ctx, p.store.q("SELECT policy FROM control_policy_modes WHERE policy = ?"), id).Scan(&have)
		if err == nil {
			return fmt.Errorf("%w: policy %q is promoted already", ErrConflict, id)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return storeErr(err)
		}
		if _, err := tx.ExecContext(ctx, p.store.q(`INSERT INTO control_policy_modes (policy, policy_sha256, replay_id, report_sha256, actor, promoted_at, seq)
			VALUES (?, ?, ?, ?, ?, ?, ?)`), id, pr.PolicySHA256, pr.ReplayID, pr.ReportSHA256, actor, micros(pr.At), seq); err != nil {
			return storeErr(err)
		}
		return p.store.audit(ctx, tx, actor, "promote", id, map[string]any{
			"replay_id": r.ID, "report_sha256": r.ReportSHA256, "policy_sha256": r.PolicySHA256, "replayed_by": r.Actor,
			"replayed_at": r.CreatedAt, "summary": doc.Summary,
		})
	})
	if err != nil {
		return nil, err
	}
	return pr, nil
}

func hexEqual(a, b string) bool {
	x, err1 := hex.DecodeString(a)
	y, err2 := hex.DecodeString(b)
	return err1 == nil && err2 == nil && len(x) == sha256.Size && string(x) == string(y)
}

// Demote returns the promoted policy id to shadow on every replica, and
// records why (reason, optional) in the audit log. A policy that is not
// promoted is ErrNotFound.
func (p *Plane) Demote(ctx context.Context, actor, id, reason string) (*Promotion, error) {
	return p.demote(ctx, actor, "demote", id, "", map[string]any{"reason": reason})
}

// demote deletes the promotion of id (of source digest sha, when not
// empty) with an audit record of action.
func (p *Plane) demote(ctx context.Context, actor, action, id, sha string, detail map[string]any) (*Promotion, error) {
	var pr *Promotion
	err := p.store.versioned(ctx, func(tx *sql.Tx, _ int64) error {
		prs, err := p.store.promotions(ctx, tx, id)
		if err != nil {
			return err
		}
		if len(prs) == 0 || (sha != "" && prs[0].PolicySHA256 != sha) {
			return fmt.Errorf("%w: policy %q is not promoted", ErrNotFound, id)
		}
		pr = &prs[0]
		if _, err := tx.ExecContext(ctx, p.store.q("DELETE FROM control_policy_modes WHERE policy = ?"), id); err != nil {
			return storeErr(err)
		}
		detail["replay_id"], detail["report_sha256"], detail["policy_sha256"], detail["promoted_by"] = pr.ReplayID, pr.ReportSHA256, pr.PolicySHA256, pr.Actor
		return p.store.audit(ctx, tx, actor, action, id, detail)
	})
	return pr, err
}

type rowsQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// promotions reads the promotions (of policy id only, when not empty),
// in policy order.
func (s *Store) promotions(ctx context.Context, q rowsQuerier, id string) ([]Promotion, error) {
	query, args := "SELECT policy, policy_sha256, replay_id, report_sha256, actor, promoted_at FROM control_policy_modes", []any{}
	if id != "" {
		query, args = query+" WHERE policy = ?", append(args, id)
	}
	rows, err := q.QueryContext(ctx, s.q(query+" ORDER BY policy"), args...)
	if err != nil {
		return nil, storeErr(err)
	}
	defer rows.Close()
	out := []Promotion{}
	for rows.Next() {
		var (
			pr Promotion
			at int64
		)
		if err := rows.Scan(&pr.Policy, &pr.PolicySHA256, &pr.ReplayID, &pr.ReportSHA256, &pr.Actor, &at); err != nil {
			return nil, storeErr(err)
		}
		pr.At = fromMicros(at)
		out = append(out, pr)
	}
	return out, storeErr(rows.Err())
}

// Promotions are the promotions this replica applies, as of its last
// poll, in policy order.
func (p *Plane) Promotions() []Promotion {
	if prs := p.promos.Load(); prs != nil {
		return append([]Promotion(nil), (*prs)...)
	}
	return []Promotion{}
}

// applyPromotions makes prs the replica's promotions, and its gate's.
func (p *Plane) applyPromotions(prs []Promotion) {
	sort.Slice(prs, func(i, j int) bool { return prs[i].Policy < prs[j].Policy })
	p.promos.Store(&prs)
	m := make(map[string]string, len(prs))
	for _, pr := range prs {
		m[pr.Policy] = pr.PolicySHA256
	}
	p.gate.SetPromotions(m)
}

// loadPromotions reads the promotions from the database and applies them.
func (p *Plane) loadPromotions(ctx context.Context) error {
	prs, err := p.store.promotions(ctx, p.store.db, "")
	if err != nil {
		return err
	}
	p.applyPromotions(prs)
	return nil
}

// checkDrift drops the promotion of a policy whose source this replica
// loaded with the promoted digest and now loads with another (its file
// changed): the acknowledgment was for other code. It logs and audits
// the drop; a replica that never loaded the promoted source only keeps
// the policy in shadow (see gate.Gate.SetPromotions). It runs on the poll's
// goroutine.
func (p *Plane) checkDrift(ctx context.Context) {
	set := p.gate.Policies()
	for _, pr := range p.Promotions() {
		var now string
		if set != nil {
			if info, ok := set.Policy(pr.Policy); ok {
				now = info.SourceSHA256
			}
		}
		if now == pr.PolicySHA256 {
			p.seen[pr.Policy] = now
			continue
		}
		if p.seen[pr.Policy] != pr.PolicySHA256 {
			continue
		}
		_, err := p.demote(ctx, "costgate", "promotion_dropped", pr.Policy, pr.PolicySHA256, map[string]any{
			"reason": "the policy's source changed after its promotion", "loaded_sha256": now,
		})
		switch {
		case err == nil:
			p.log.Warn("policy promotion dropped: its source changed; it is back in shadow", "policy", pr.Policy,
				"promoted_sha256", pr.PolicySHA256, "loaded_sha256", now, "replay_id", pr.ReplayID)
		case errors.Is(err, ErrNotFound): // another replica dropped it
		default:
			p.log.Warn("policy promotion: dropping it failed; it stays in shadow here", "policy", pr.Policy, "err", err)
			continue
		}
		delete(p.seen, pr.Policy)
		if err := p.loadPromotions(ctx); err != nil {
			p.log.Warn("policy promotions: reading them failed", "err", err)
		}
	}
}
