package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// Config is costgate's whole configuration: one YAML file, documented field
// by field in the README. Load reads and validates it; the zero value of each
// optional field is replaced by the default named in its comment.
type Config struct {
	// Listen is the data plane's address. Default "127.0.0.1:8080"
	// (loopback); a deployment sets ":8080" explicitly.
	Listen string `yaml:"listen"`
	// AdminListen is the admin plane's address. Default "127.0.0.1:9090".
	AdminListen string `yaml:"admin_listen"`
	// AdminToken is the admin plane's bearer token. Default:
	// Defaults.AdminToken (costgate serve: the COSTGATE_ADMIN_TOKEN
	// environment variable). Required.
	AdminToken string `yaml:"admin_token"`
	// DataDir holds the embedded ledger and its spool. Default "./costgate-data".
	DataDir string `yaml:"data_dir"`
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	// Default 8 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// Region names this replica's region, recorded in the ledger.
	Region string `yaml:"region"`
	// RLSListen is the address of Envoy's rate limit service (gRPC,
	// envoy.service.ratelimit.v3). Empty (the default) serves none.
	RLSListen string `yaml:"rls_listen"`
	// RLS maps Envoy's rate limit domains and descriptors to tenants,
	// limits and budgets (see RLSConfig).
	RLS RLSConfig `yaml:"rls"`
	// StreamGuardAll debits streams' output in increments as it passes
	// (see StreamGuardConfig); an upstream may set its own.
	StreamGuardAll StreamGuardConfig `yaml:"stream_guard"`

	Store    StoreConfig    `yaml:"store"`
	Ledger   LedgerConfig   `yaml:"ledger"`
	Policies PoliciesConfig `yaml:"policies"`
	Costs    CostsConfig    `yaml:"costs"`

	Upstreams []UpstreamConfig `yaml:"upstreams"`
	Routes    []RouteConfig    `yaml:"routes"`
	Tenants   []TenantConfig   `yaml:"tenants"`
	Limits    []LimitConfig    `yaml:"limits"`
	Budgets   []BudgetConfig   `yaml:"budgets"`

	Reservations ReservationsConfig `yaml:"reservations"`
	Capture      CaptureConfig      `yaml:"capture"`
	Control      ControlConfig      `yaml:"control"`
	Regions      *RegionsConfig     `yaml:"regions"`

	// dir is the directory relative paths in the file are resolved against.
	dir string
	// policyFS, when set, holds the policies instead of Policies.Dir: the
	// embedded quickstart uses it.
	policyFS fs.FS
}

// StoreConfig chooses the limiter store.
type StoreConfig struct {
	// Redis is a redis:// or rediss:// URL. Empty means the in-memory store
	// (single node). Default: Defaults.Redis (costgate serve: the REDIS_URL
	// environment variable).
	Redis string `yaml:"redis"`
	// Timeout bounds each Redis call, from the moment it is sent to its
	// reply; a slower call counts as a store failure and the limits'
	// on_store_failure posture applies. A debit whose reply comes later is
	// treated as applied: the store returns it when the reply comes.
	// Default 100ms: a healthy Redis answers in well under a millisecond,
	// and a CPU-starved proxy was measured missing 25ms.
	Timeout time.Duration `yaml:"timeout"`
	// QueueTimeout bounds the wait for a place in a batch before a call is
	// sent. A request that waits longer is shed (503 overloaded, with
	// Retry-After): a busy Redis is not a failing one, and no request is
	// admitted past a limit for it. Default 500ms.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// BreakerFailures consecutive failures open the circuit breaker, which
	// then refuses calls at once for BreakerCooldown before probing Redis
	// again. Defaults 5 and 1s.
	BreakerFailures int           `yaml:"breaker_failures"`
	BreakerCooldown time.Duration `yaml:"breaker_cooldown"`
	// FallbackReplicas is how many replicas are expected to share a limit
	// while Redis is out: each fail-open limit is enforced locally at its
	// rate and burst divided by this number. Default 1.
	FallbackReplicas int64 `yaml:"fallback_replicas"`
	// ReconcileInterval is how often the budgets' counters in the store are
	// brought up to the ledger's spend (also at start and when Redis comes
	// back). Default 5m.
	ReconcileInterval time.Duration `yaml:"reconcile_interval"`
	// MaxBatch is the most concurrent requests whose limiter calls share
	// one Redis script call (a request that finds Redis idle is sent at
	// once, alone). 1 sends every call alone. Default 64.
	MaxBatch int `yaml:"max_batch"`
	// MaxKeysPerTenant bounds the counters (limiter keys) one replica lets
	// a tenant hold in the store at once whose value the caller chooses: a
	// limit keyed by an attribute (attr.NAME) or by ip, by a model the
	// price table does not know, by a user or key that only the rate
	// limit service names, and every rate limit service descriptor's
	// counter. A request that would make one more is refused (429, its
	// code the limit's name, its policy store.max_keys_per_tenant) and
	// writes nothing, so that one tenant cannot fill
	// the store (Redis under maxmemory refuses every write, the other
	// tenants' included). A counter is held until it may have expired in
	// the store (weighted.Limit.KeyLife after its last write). N replicas
	// let a tenant hold N times as many. Default 4096.
	MaxKeysPerTenant int `yaml:"max_keys_per_tenant"`
}

// DefaultMaxKeysPerTenant is store.max_keys_per_tenant's default, and
// MaxKeysPerTenantBound its largest value: 2^20 counters of a tenant's
// choosing, about 300 MB of Redis at the most.
const (
	DefaultMaxKeysPerTenant = 4096
	MaxKeysPerTenantBound   = 1 << 20
)

// LedgerConfig chooses the ledger's database.
type LedgerConfig struct {
	// DSN is a postgres:// URL. Empty means the embedded ledger under
	// DataDir. Default: Defaults.LedgerDSN (costgate serve: the DATABASE_URL
	// environment variable).
	DSN string `yaml:"dsn"`
	// DurableSettle makes the settlement of a request durable on disk
	// (fsync'd, shared by concurrent requests) before the last byte of its
	// answer reaches the client, instead of written to the spool (which a
	// crash of the process never loses, and a crash of the machine loses
	// back to the spool's last sync). It adds one group fsync, about 1 ms,
	// to the end of every answer. Default false.
	DurableSettle bool `yaml:"durable_settle"`
	// PeerWait is the longest a restore of counters from a shared
	// PostgreSQL ledger waits for the other replicas to flush what they
	// have not written yet (see ledger.Config.PeerWait): a replica that
	// does not answer by then is not waited for. It holds the requests
	// that found the loss for as long. 0 means the default, 2s; at most
	// 1m.
	PeerWait time.Duration `yaml:"peer_wait"`
	// CloseTimeout is how long a shutdown waits for the spool to reach
	// the ledger's store (see ledger.Config.CloseTimeout): what does not
	// make it stays in data_dir's spool for the next start, which
	// replays it. 0 means the default, 10s; at most 5m.
	CloseTimeout time.Duration `yaml:"close_timeout"`
}

// maxCloseTimeout bounds ledger.close_timeout: a shutdown waits as long.
const maxCloseTimeout = 5 * time.Minute

// maxPeerWait bounds ledger.peer_wait: the requests that find a loss wait
// as long.
const maxPeerWait = time.Minute

// PoliciesConfig names the Rego policies evaluated on every request.
type PoliciesConfig struct {
	// Dir is a directory of .rego files, relative to the config file.
	// Empty means no policy: every request the limits admit is allowed.
	Dir string `yaml:"dir"`
}

// CostsConfig tunes the cost model.
type CostsConfig struct {
	// Prices add to or override the built-in price table, by model name.
	Prices map[string]PriceConfig `yaml:"prices"`
	// DefaultPrice prices a model the table does not know. Default: the
	// estimator's own default (never free).
	DefaultPrice *PriceConfig `yaml:"default_price"`
	// FreeUnknown lets unknown models ride free. Default false.
	FreeUnknown bool `yaml:"free_unknown"`
	// OutputReserve is the share of the output limit reserved before the
	// response: a percentage, 1 to 100, or a learned quantile such as p95
	// (see Reserve). Default 100.
	OutputReserve Reserve `yaml:"output_reserve"`
	// Learned tunes the learned output estimates (output_reserve: pNN).
	Learned LearnedConfig `yaml:"learned"`
	// Aliases add to the built-in alias table: another name (a dated
	// snapshot) of a priced model, priced and limited as that model.
	Aliases map[string]string `yaml:"aliases"`
	// ServerContextTokens and SearchResultTokens are the input tokens
	// reserved for content the upstream adds to a prompt that the request
	// does not hold (see costmodel.Config). Default 300000 and 10000.
	ServerContextTokens int64 `yaml:"server_context_tokens"`
	SearchResultTokens  int64 `yaml:"search_result_tokens"`
}

// PriceConfig is a price in dollars per million tokens, written as exact
// decimals ("2.50").
type PriceConfig struct {
	Input           USD   `yaml:"input"`
	CachedInput     USD   `yaml:"cached_input"`
	CacheWrite      USD   `yaml:"cache_write"`
	Output          USD   `yaml:"output"`
	MaxOutputTokens int64 `yaml:"max_output_tokens"`
	// WebSearch, FileSearch and Container are per-call prices (per search,
	// per file_search call, per GB of container session); zero keeps the
	// built-in model's (see costmodel.Config.Prices).
	WebSearch  USD `yaml:"web_search"`
	FileSearch USD `yaml:"file_search"`
	Container  USD `yaml:"container"`
	// USInferencePercent and FastPercent are shares of the token rates, in
	// percent; zero keeps the built-in model's.
	USInferencePercent int64 `yaml:"us_inference_percent"`
	FastPercent        int64 `yaml:"fast_percent"`
}

// USD is a dollar amount in the config file, read exactly.
type USD costmodel.NanoUSD

// UnmarshalYAML reads a decimal string or number as dollars.
func (u *USD) UnmarshalYAML(n *yaml.Node) error {
	v, err := costmodel.ParseUSD(n.Value)
	if err != nil {
		return err
	}
	*u = USD(v)
	return nil
}

// UpstreamConfig is a dependency costgate forwards to.
type UpstreamConfig struct {
	// Name identifies the upstream in routes and in /u/{name}/.
	Name string `yaml:"name"`
	// Kind is "openai", "anthropic" or "generic".
	Kind string `yaml:"kind"`
	// BaseURL is the upstream's URL without the /v1 path.
	BaseURL string `yaml:"base_url"`
	// APIKey is the credential costgate injects; APIKeyEnv names an
	// environment variable that holds it instead.
	APIKey    string `yaml:"api_key"`
	APIKeyEnv string `yaml:"api_key_env"`
	// Simulate serves this upstream from costgate's built-in simulator:
	// "never" (default), "always", or "auto" (when the credential is empty).
	Simulate string `yaml:"simulate"`
	// Timeout bounds a whole upstream exchange. Default 10m.
	Timeout time.Duration `yaml:"timeout"`

	// AuthHeader names the header a generic upstream takes its credential
	// in, as is ("X-Subscription-Token"); default "Authorization" with
	// "Bearer ". AuthQuery names a query parameter instead ("api_key").
	AuthHeader string `yaml:"auth_header"`
	AuthQuery  string `yaml:"auth_query"`
	// Cost prices a generic upstream's requests (see costmodel.Rule);
	// required for kind generic. Paths price some paths differently.
	Cost  *costmodel.Rule `yaml:"cost"`
	Paths []PathCost      `yaml:"paths"`
	// Methods are the HTTP methods forwarded to a generic upstream; a
	// request with another is answered 405 with an Allow header. Default
	// GET, HEAD, POST, PUT, PATCH, DELETE. TRACE and CONNECT are never
	// forwarded (an upstream that echoes a TRACE would show the client the
	// injected credential).
	Methods []string `yaml:"methods"`
	// StreamGuard replaces the config's stream_guard for this upstream;
	// nil keeps it.
	StreamGuard *StreamGuardConfig `yaml:"stream_guard"`
}

// defaultMethods are a generic upstream's methods when it names none.
var defaultMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

// ForwardableMethods are the methods a generic upstream may be given.
var ForwardableMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// PathCost prices the requests under one path prefix of a generic
// upstream; the longest matching prefix wins over the upstream's Cost.
type PathCost struct {
	Prefix string         `yaml:"prefix"`
	Cost   costmodel.Rule `yaml:"cost"`
}

// RouteConfig sends the requests of one path to an upstream.
type RouteConfig struct {
	// Path is an OpenAI or Anthropic API path, such as /v1/chat/completions.
	Path string `yaml:"path"`
	// Upstream names the upstream. Default: the first upstream whose kind
	// serves the path.
	Upstream string `yaml:"upstream"`
}

// TenantConfig is a customer of the gated API.
type TenantConfig struct {
	Name string      `yaml:"name"`
	Plan string      `yaml:"plan"`
	Keys []KeyConfig `yaml:"keys"`
}

// KeyConfig is one API key of a tenant. The key itself is held only as a
// SHA-256 hash in memory.
type KeyConfig struct {
	// ID names the key in the ledger and logs; default: the key's hash prefix.
	ID string `yaml:"id"`
	// Key is the secret; KeyEnv names an environment variable holding it;
	// KeyFile names a file holding it (relative to the config file), as
	// container secrets are mounted. Set exactly one.
	Key     string `yaml:"key"`
	KeyEnv  string `yaml:"key_env"`
	KeyFile string `yaml:"key_file"`

	fromFile string // the secret read from KeyFile
	// User is the end user the key belongs to, if any.
	User string `yaml:"user"`
}

// LimitConfig is one weighted limit.
type LimitConfig struct {
	Name string `yaml:"name"`
	// Plans the limit applies to; empty means every plan.
	Plans []string `yaml:"plans"`
	// Dimensions make the limit's key: any of tenant, user, api_key, ip,
	// model, route, upstream, region. Empty means one global key.
	Dimensions []string `yaml:"dimensions"`
	// Algorithm: token_bucket (default), gcra, sliding_window, fixed_window,
	// sliding_log, concurrency.
	Algorithm string `yaml:"algorithm"`
	// Unit: requests (default), tokens, input_tokens, output_tokens, usd.
	Unit string `yaml:"unit"`
	// Rate units per Period; for usd, Rate is in dollars (see RateUSD).
	Rate    int64         `yaml:"rate"`
	RateUSD USD           `yaml:"rate_usd"`
	Period  time.Duration `yaml:"period"`
	// Burst is the capacity; default Rate.
	Burst int64 `yaml:"burst"`
	// OnStoreFailure: fail_open (default) or fail_closed.
	OnStoreFailure string `yaml:"on_store_failure"`
	// Mode: enforce (default) or shadow.
	Mode string `yaml:"mode"`
	// Lease makes the limit leased (see LeaseConfig); nil is strict.
	Lease *LeaseConfig `yaml:"lease"`
}

// BudgetConfig is a spend cap in dollars per period.
type BudgetConfig struct {
	Name string `yaml:"name"`
	// Plans the budget applies to; empty means every plan.
	Plans []string `yaml:"plans"`
	// Scope: tenant (default), user or api_key.
	Scope string `yaml:"scope"`
	// Period: day (default), a fixed 24-hour window from UTC midnight, or
	// month, a UTC calendar month.
	Period string `yaml:"period"`
	Amount USD    `yaml:"amount"`
	// Lease makes the budget leased (see LeaseConfig); nil is strict.
	Lease *LeaseConfig `yaml:"lease"`
	// OnStoreFailure: fail_open (default) or fail_closed. A fail-closed
	// budget answers 503 while the limiter store is out, and while its
	// spend cannot be known for a restore (the ledger's database out and
	// the spend of its period never read by this node).
	OnStoreFailure string `yaml:"on_store_failure"`
}

// Defaults are the values a config takes where its file leaves the field
// empty; the file wins over them. Parsing never reads the environment:
// costgate serve fills Defaults from it (COSTGATE_ADMIN_TOKEN, REDIS_URL,
// DATABASE_URL), and its flags win over the file.
type Defaults struct {
	AdminToken string // admin_token
	Redis      string // store.redis
	LedgerDSN  string // ledger.dsn
}

// Load reads, defaults and validates the config file at path, with no
// Defaults.
func Load(path string) (*Config, error) { return LoadWith(path, Defaults{}) }

// LoadWith is Load with the defaults d under the file's values.
func LoadWith(path string, d Defaults) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := parse(b, abs, d)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse reads, defaults and validates a config from YAML; relative paths
// in it are relative to the working directory. Unknown fields are errors,
// so that a misspelt field is not silently ignored. Parse depends on b
// alone, never on the environment (but for the secrets a key_env or
// api_key_env names).
func Parse(b []byte) (*Config, error) { return parse(b, "", Defaults{}) }

// ParseWith is Parse with the defaults d under the file's values.
func ParseWith(b []byte, d Defaults) (*Config, error) { return parse(b, "", d) }

func parse(b []byte, dir string, d Defaults) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); errors.Is(err, io.EOF) {
		return nil, errors.New("the config is empty: it needs at least admin_token, upstreams and tenants (see examples/quickstart/costgate.yaml)")
	} else if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	c.dir = dir
	c.applyDefaults(d)
	c.readKeyFiles()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// readKeyFiles reads the secrets of keys given as files; a file that cannot
// be read leaves the key empty, which Validate reports.
func (c *Config) readKeyFiles() {
	for i := range c.Tenants {
		for j := range c.Tenants[i].Keys {
			k := &c.Tenants[i].Keys[j]
			if k.KeyFile == "" {
				continue
			}
			path := k.KeyFile
			if c.dir != "" && !filepath.IsAbs(path) {
				path = filepath.Join(c.dir, path)
			}
			if b, err := readSmallFile(path, 4096); err == nil {
				k.fromFile = strings.TrimSpace(string(b))
			}
		}
	}
}

// WithPolicyFS makes the config read its policies from fsys instead of
// Policies.Dir. The embedded quickstart uses it.
func (c *Config) WithPolicyFS(fsys fs.FS) *Config {
	c.policyFS = fsys
	return c
}

func (c *Config) applyDefaults(d Defaults) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Listen, "127.0.0.1:8080")
	def(&c.AdminListen, "127.0.0.1:9090")
	def(&c.AdminToken, d.AdminToken)
	def(&c.DataDir, "./costgate-data")
	def(&c.Store.Redis, d.Redis)
	def(&c.Ledger.DSN, d.LedgerDSN)
	c.Reservations.applyDefaults()
	c.Capture.applyDefaults()
	c.Control.applyDefaults()
	if c.Store.Timeout == 0 {
		c.Store.Timeout = 100 * time.Millisecond
	}
	if c.Store.QueueTimeout == 0 {
		c.Store.QueueTimeout = 500 * time.Millisecond
	}
	if c.Store.BreakerFailures == 0 {
		c.Store.BreakerFailures = 5
	}
	if c.Store.BreakerCooldown == 0 {
		c.Store.BreakerCooldown = time.Second
	}
	if c.Store.MaxBatch == 0 {
		c.Store.MaxBatch = weighted.DefaultMaxBatch
	}
	if c.Store.FallbackReplicas == 0 {
		c.Store.FallbackReplicas = 1
	}
	if c.Store.MaxKeysPerTenant == 0 {
		c.Store.MaxKeysPerTenant = DefaultMaxKeysPerTenant
	}
	if c.Store.ReconcileInterval == 0 {
		c.Store.ReconcileInterval = 5 * time.Minute
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 8 << 20
	}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		def(&u.Simulate, "never")
		if u.Timeout == 0 {
			u.Timeout = 10 * time.Minute
		}
		if u.Kind == "generic" && len(u.Methods) == 0 {
			u.Methods = slices.Clone(defaultMethods)
		}
		for j, m := range u.Methods {
			u.Methods[j] = strings.ToUpper(m)
		}
	}
	for i := range c.Limits {
		l := &c.Limits[i]
		def(&l.Algorithm, "token_bucket")
		def(&l.Unit, "requests")
		def(&l.OnStoreFailure, "fail_open")
		def(&l.Mode, "enforce")
	}
	for i := range c.Budgets {
		b := &c.Budgets[i]
		def(&b.Scope, "tenant")
		def(&b.Period, "day")
		def(&b.OnStoreFailure, "fail_open")
	}
	c.guardDefaults()
	c.RLS.applyDefaults()
}

// FieldError is a config error at a field path, such as
// "limits[2].algorithm".
type FieldError struct {
	Path   string
	Reason string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Reason }

// Validate checks every field and returns all problems found, each a
// *FieldError, joined.
func (c *Config) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
	}
	// unique reports an empty name, or one seen already among what.
	unique := func(seen map[string]bool, path, what, name string) {
		switch {
		case name == "":
			bad(path, "required")
		case seen[name]:
			bad(path, "duplicate %s %q", what, name)
		}
		seen[name] = true
	}
	recorded := func(path, name string) { checkRecorded(bad, path, name) }
	recorded("region", c.Region)
	if c.AdminToken == "" {
		bad("admin_token", "required (or set COSTGATE_ADMIN_TOKEN)")
	}
	if publicSecrets[c.AdminToken] && !loopback(c.AdminListen) {
		bad("admin_token", "%q is the published demo token: set your own (or COSTGATE_ADMIN_TOKEN) to listen on %q, which is not a loopback address", c.AdminToken, c.AdminListen)
	}
	if c.Store.MaxBatch < 0 || c.Store.MaxBatch > 1024 {
		bad("store.max_batch", "must be between 1 and 1024")
	}
	if c.Ledger.PeerWait < 0 || c.Ledger.PeerWait > maxPeerWait {
		bad("ledger.peer_wait", "must be between 0 (the default, 2s) and %s", maxPeerWait)
	}
	if c.Ledger.CloseTimeout < 0 || c.Ledger.CloseTimeout > maxCloseTimeout {
		bad("ledger.close_timeout", "must be between 0 (the default, 10s) and %s", maxCloseTimeout)
	}
	if c.Store.Timeout < 0 || c.Store.QueueTimeout < 0 || c.Store.BreakerFailures < 0 || c.Store.BreakerCooldown < 0 || c.Store.FallbackReplicas < 0 || c.Store.ReconcileInterval < 0 {
		bad("store", "timeout, breaker_failures, breaker_cooldown, fallback_replicas and reconcile_interval must be positive")
	}
	if c.Store.MaxKeysPerTenant < 0 || c.Store.MaxKeysPerTenant > MaxKeysPerTenantBound {
		bad("store.max_keys_per_tenant", "must be between 1 and %d (0 is the default, %d)", MaxKeysPerTenantBound, DefaultMaxKeysPerTenant)
	}
	if c.MaxBodyBytes < 0 {
		bad("max_body_bytes", "must be positive")
	}
	c.Costs.validateLearned(bad)
	upstreams := map[string]bool{}
	for i, u := range c.Upstreams {
		p := fmt.Sprintf("upstreams[%d]", i)
		unique(upstreams, p+".name", "upstream", u.Name)
		recorded(p+".name", u.Name)
		if !slices.Contains([]string{"openai", "anthropic", "generic"}, u.Kind) {
			bad(p+".kind", "must be openai, anthropic or generic, not %q", u.Kind)
		}
		if !slices.Contains([]string{"never", "always", "auto"}, u.Simulate) {
			bad(p+".simulate", "must be never, always or auto, not %q", u.Simulate)
		}
		if u.Timeout < 0 {
			bad(p+".timeout", "must be positive (the default is 10m), not %s", u.Timeout)
		}
		if u.Kind == "generic" {
			if u.Simulate != "never" {
				bad(p+".simulate", "the simulator serves openai and anthropic upstreams, not generic ones")
			}
			if u.Cost == nil {
				bad(p+".cost", "required for a generic upstream: how its requests are priced")
			} else if err := u.Cost.Validate(); err != nil {
				bad(p+".cost", "%v", err)
			}
			for j, m := range u.Methods {
				switch {
				case m == "TRACE" || m == "CONNECT":
					bad(fmt.Sprintf("%s.methods[%d]", p, j), "%s is never forwarded: an upstream that echoes the request would show the client the injected credential", m)
				case !slices.Contains(ForwardableMethods, m):
					bad(fmt.Sprintf("%s.methods[%d]", p, j), "unknown method %q (want some of %s)", m, strings.Join(ForwardableMethods, ", "))
				}
			}
			for j, pc := range u.Paths {
				switch {
				case !strings.HasPrefix(pc.Prefix, "/"):
					bad(fmt.Sprintf("%s.paths[%d].prefix", p, j), "must start with /")
				case CleanPrefix(pc.Prefix) != pc.Prefix:
					bad(fmt.Sprintf("%s.paths[%d].prefix", p, j), "must be a clean path (%q): requests are matched after their dot-segments and empty segments are removed", CleanPrefix(pc.Prefix))
				}
				if err := pc.Cost.Validate(); err != nil {
					bad(fmt.Sprintf("%s.paths[%d].cost", p, j), "%v", err)
				}
				// Paths match in any case (servers route /EXPENSIVE as
				// /expensive): two prefixes that differ only in case would
				// leave the rule a request pays to their order.
				if k := slices.IndexFunc(u.Paths[:j], func(o PathCost) bool { return strings.EqualFold(o.Prefix, pc.Prefix) }); k >= 0 {
					bad(fmt.Sprintf("%s.paths[%d].prefix", p, j), "%q is paths[%d]'s prefix %q: paths match in any case", pc.Prefix, k, u.Paths[k].Prefix)
				}
			}
		} else {
			if u.Cost != nil || len(u.Paths) > 0 {
				bad(p+".cost", "only a generic upstream takes a cost rule; %s upstreams are priced by model", u.Kind)
			}
			if len(u.Methods) > 0 {
				bad(p+".methods", "only a generic upstream takes methods; %s upstreams serve their API's routes", u.Kind)
			}
		}
		if u.AuthHeader != "" && u.AuthQuery != "" {
			bad(p, "set auth_header or auth_query, not both")
		}
		if u.Simulate != "always" && !strings.HasPrefix(u.BaseURL, "http://") && !strings.HasPrefix(u.BaseURL, "https://") {
			bad(p+".base_url", "must be an http:// or https:// URL, not %q", RedactURL(u.BaseURL))
		}
	}
	for i, r := range c.Routes {
		p := fmt.Sprintf("routes[%d]", i)
		if _, ok := RouteKinds[r.Path]; !ok {
			bad(p+".path", "unknown API path %q", r.Path)
		}
		if !upstreams[r.Upstream] {
			bad(p+".upstream", "no upstream named %q", r.Upstream)
		}
	}
	keys := map[string]bool{}
	tenants := map[string]bool{}
	plans := map[string]bool{} // the plans some tenant has
	// knownPlans reports a limit's or budget's plan that no tenant has: a
	// misspelt plan would otherwise apply to nobody, silently.
	knownPlans := func(p string, names []string) {
		for j, plan := range names {
			if !plans[plan] {
				bad(fmt.Sprintf("%s.plans[%d]", p, j), "no tenant has plan %q", plan)
			}
		}
	}
	for i, t := range c.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		unique(tenants, p+".name", "tenant", t.Name)
		recorded(p+".name", t.Name)
		recorded(p+".plan", t.Plan)
		switch {
		case strings.ContainsAny(t.Name, "{}"):
			bad(p+".name", "must not contain '{' or '}' (they delimit the limiter's hash tags: tenant %q would count under another tenant's)", t.Name)
		case strings.ContainsAny(t.Name, "%\x00") || !utf8.ValidString(t.Name):
			bad(p+".name", "must be UTF-8 text without '%%' or NUL (the rate limit service reads those as %%XX, and could never name tenant %q)", t.Name)
		}
		if t.Plan == "" {
			bad(p+".plan", "required: limits and budgets apply by plan")
		}
		plans[t.Plan] = true
		for j, k := range t.Keys {
			kp := fmt.Sprintf("%s.keys[%d]", p, j)
			secret := k.Secret()
			set := 0
			for _, v := range []string{k.Key, k.KeyEnv, k.KeyFile} {
				if v != "" {
					set++
				}
			}
			switch {
			case set > 1:
				bad(kp, "set one of key, key_env and key_file")
			case secret == "" && k.KeyEnv != "":
				bad(kp+".key_env", "environment variable %s is empty", k.KeyEnv)
			case secret == "" && k.KeyFile != "":
				bad(kp+".key_file", "cannot read a key from %s", k.KeyFile)
			case secret == "":
				bad(kp+".key", "required")
			case keys[secret]:
				bad(kp+".key", "the same key is given twice")
			case publicSecrets[secret] && !loopback(c.Listen):
				bad(kp+".key", "%q is a published demo key: give the tenant a key of its own to listen on %q, which is not a loopback address", secret, c.Listen)
			}
			keys[secret] = true
			recorded(kp+".id", k.ID)
			recorded(kp+".user", k.User)
			if strings.ContainsAny(k.User, "%\x00") || !utf8.ValidString(k.User) {
				// One user, two counters: the proxy would key the user as
				// written, the rate limit service as it reads it.
				bad(kp+".user", "must be UTF-8 text without '%%' or NUL (the rate limit service reads those as %%XX, and would count user %q apart)", k.User)
			}
		}
	}
	names := map[string]bool{}
	for i, l := range c.Limits {
		p := fmt.Sprintf("limits[%d]", i)
		unique(names, p+".name", "limit", l.Name)
		knownPlans(p, l.Plans)
		for _, d := range l.Dimensions {
			if name, ok := strings.CutPrefix(d, AttributePrefix); ok {
				if !ValidAttributeName(name) {
					bad(p+".dimensions", "attribute dimension %q: the name after %q must be 1 to 64 of a-z, 0-9, _ and -", d, AttributePrefix)
				}
				continue
			}
			if !slices.Contains(dimensions, d) {
				bad(p+".dimensions", "unknown dimension %q (want one of %s, or %sNAME for a request attribute)", d, strings.Join(dimensions, ", "), AttributePrefix)
			}
		}
		if _, ok := Units[l.Unit]; !ok {
			bad(p+".unit", "unknown unit %q (want requests, tokens, input_tokens, output_tokens or usd)", l.Unit)
		}
		if l.OnStoreFailure != "fail_open" && l.OnStoreFailure != "fail_closed" {
			bad(p+".on_store_failure", "must be fail_open or fail_closed, not %q", l.OnStoreFailure)
		}
		if l.Mode != "enforce" && l.Mode != "shadow" {
			bad(p+".mode", "must be enforce or shadow, not %q", l.Mode)
		}
		if l.Unit == "usd" && l.Rate != 0 {
			bad(p+".rate", "a usd limit takes rate_usd, in dollars")
		}
		if l.Unit != "usd" && l.RateUSD != 0 {
			bad(p+".rate_usd", "only a usd limit takes rate_usd; a %s limit takes rate, in %s", l.Unit, l.Unit)
		}
		l.Lease.validate(p+".lease", l.Algorithm == "concurrency", bad)
		l.validateLimit(p, bad)
	}
	for i, b := range c.Budgets {
		p := fmt.Sprintf("budgets[%d]", i)
		unique(names, p+".name", "limit or budget", b.Name)
		knownPlans(p, b.Plans)
		if !slices.Contains([]string{"tenant", "user", "api_key"}, b.Scope) {
			bad(p+".scope", "must be tenant, user or api_key, not %q", b.Scope)
		}
		if b.Period != "day" && b.Period != "month" {
			bad(p+".period", "must be day or month, not %q", b.Period)
		}
		if b.Amount <= 0 {
			bad(p+".amount", "must be a positive dollar amount")
		}
		if b.OnStoreFailure != "fail_open" && b.OnStoreFailure != "fail_closed" {
			bad(p+".on_store_failure", "must be fail_open or fail_closed, not %q", b.OnStoreFailure)
		}
		b.Lease.validate(p+".lease", false, bad)
	}
	c.validateGuards(bad)
	c.Reservations.validate(bad)
	c.Capture.validate(bad)
	c.Control.validate(bad)
	c.Regions.validate(c, bad)
	c.validateRLS(names, bad)
	return errors.Join(errs...)
}

// checkRecorded reports a name that every ledger entry of its requests
// records (a tenant, key, user, plan, upstream or region) but the ledger
// could not store: every request would be refused when its entry is
// written.
func checkRecorded(bad func(path, format string, args ...any), path, name string) {
	if !ledger.ValidKeyText(name) {
		bad(path, "must be UTF-8 text without NUL, at most %d bytes: the ledger records it with every request", ledger.MaxKeyField)
	}
}

// publicSecrets are the API keys and the admin token published with the
// quickstart and the demo: anyone may know them, so a config that uses one
// is served on loopback addresses only.
var publicSecrets = map[string]bool{
	"cg-demo-admin": true, "cg-demo-free": true, "cg-demo-pro": true,
	"cg-demo-acme": true, "cg-demo-globex": true, "cg-demo-initech": true,
}

// loopback tells whether a listen address ("127.0.0.1:8080",
// "localhost:8080", "[::1]:8080") accepts connections from this machine
// only. ":8080" and "0.0.0.0:8080" listen on every interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// AttributePrefix starts a limit dimension that names a request's custom
// attribute (attr.job): the reserve API's attributes.
const AttributePrefix = "attr."

// ValidAttributeName tells whether name may name a custom attribute: 1 to
// 64 of a-z, 0-9, _ and -.
func ValidAttributeName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// dimensions are the request attributes a limit may be keyed by.
var dimensions = []string{"tenant", "user", "api_key", "ip", "model", "route", "upstream", "region"}

// Units are the limit units; the value tells how a request's cost is taken
// from its estimate or usage. Tokens add up saturating (costmodel.AddSat):
// a sum that wrapped would be a negative cost, which the limiter refuses.
var Units = map[string]func(costmodel.Usage, costmodel.NanoUSD) int64{
	"requests": func(costmodel.Usage, costmodel.NanoUSD) int64 { return 1 },
	"tokens": func(u costmodel.Usage, _ costmodel.NanoUSD) int64 {
		return costmodel.AddSat(u.InputTokens, u.OutputTokens)
	},
	"input_tokens":  func(u costmodel.Usage, _ costmodel.NanoUSD) int64 { return u.InputTokens },
	"output_tokens": func(u costmodel.Usage, _ costmodel.NanoUSD) int64 { return u.OutputTokens },
	"usd":           func(_ costmodel.Usage, c costmodel.NanoUSD) int64 { return int64(c) },
}

// Weighted converts the limit to the limiter's form.
func (l LimitConfig) Weighted() (weighted.Limit, error) {
	alg, err := weighted.ParseAlgorithm(l.Algorithm)
	if err != nil {
		return weighted.Limit{}, err
	}
	rate := l.Rate
	if l.Unit == "usd" {
		rate = int64(l.RateUSD)
	}
	wl := weighted.Limit{Name: l.Name, Algorithm: alg, Rate: rate, Period: l.Period, Burst: l.Burst}
	wl.Lease = l.Lease.Weighted(wl.Capacity())
	return wl, wl.Validate()
}

// validateLimit reports the limiter's objections to l at the field they
// concern ("limits[0].algorithm: unknown algorithm ..."); p is the limit's
// path. What only weighted.Limit.Validate can tell is reported at p.
func (l LimitConfig) validateLimit(p string, bad func(path, format string, args ...any)) {
	alg, err := weighted.ParseAlgorithm(l.Algorithm)
	if err != nil {
		bad(p+".algorithm", "%s", strings.TrimPrefix(err.Error(), "weighted: "))
	}
	if strings.ContainsAny(l.Name, ":{}") {
		bad(p+".name", "must not contain ':', '{' or '}' (they delimit the limiter's keys)")
	}
	rateField, rate := "rate", l.Rate
	if l.Unit == "usd" {
		rateField, rate = "rate_usd", int64(l.RateUSD)
	}
	switch {
	case rate < 1:
		bad(p+"."+rateField, "required: a positive number of %s per period", l.Unit)
	case l.Period <= 0:
		bad(p+".period", "required: a positive duration such as 1m or 24h")
	case l.Period > weighted.MaxPeriod:
		bad(p+".period", "%s is longer than the longest period, %s", l.Period, weighted.MaxPeriod)
	case l.Burst < 0:
		bad(p+".burst", "must not be negative")
	case err == nil && alg != weighted.TokenBucket && alg != weighted.GCRA && l.Burst != 0 && l.Burst != rate:
		bad(p+".burst", "does not apply to %s (leave it out: the capacity is the rate)", alg)
	case err == nil:
		if _, err := l.Weighted(); err != nil {
			reason := err.Error()
			if _, r, ok := strings.Cut(reason, fmt.Sprintf("limit %q: ", l.Name)); ok {
				reason = r
			}
			bad(p, "%s", reason)
		}
	}
}

// KeyID is the key's name in the ledger and the logs: its configured id, or
// the first bytes of its hash.
func (k KeyConfig) KeyID() string {
	if k.ID != "" {
		return k.ID
	}
	h := sha256.Sum256([]byte(k.Secret()))
	return "key-" + hex.EncodeToString(h[:4])
}

// Secret is the key itself, from the file, its environment variable or a file.
func (k KeyConfig) Secret() string {
	switch {
	case k.KeyEnv != "":
		return os.Getenv(k.KeyEnv)
	case k.KeyFile != "":
		return k.fromFile
	}
	return k.Key
}

// Credential is the key costgate sends the upstream.
func (u UpstreamConfig) Credential() string {
	if u.APIKeyEnv != "" {
		return os.Getenv(u.APIKeyEnv)
	}
	return u.APIKey
}

// Simulated tells whether the built-in simulator serves the upstream.
func (u UpstreamConfig) Simulated() bool {
	return u.Simulate == "always" || (u.Simulate == "auto" && u.Credential() == "")
}

// readSmallFile reads a regular file of at most max bytes: a key file that
// is a device, a pipe or huge is an error, not a hang.
func readSmallFile(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > max {
		return nil, fmt.Errorf("%s is not a regular file of at most %d bytes", path, max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// DataDirPath is where the embedded ledger and the spool live: data_dir,
// resolved against the config file's directory.
func (c *Config) DataDirPath() string { return c.dataDir() }

// dataDir is where the embedded ledger lives, relative to the config file.
func (c *Config) dataDir() string {
	if c.dir != "" && !filepath.IsAbs(c.DataDir) {
		return filepath.Join(c.dir, c.DataDir)
	}
	return c.DataDir
}

// PolicyFS is the policies' directory, or nil for none.
func (c *Config) PolicyFS() fs.FS {
	if c.policyFS != nil {
		return c.policyFS
	}
	if c.Policies.Dir == "" {
		return nil
	}
	return os.DirFS(c.PolicyDir())
}

func (c *Config) PolicyDir() string {
	if c.dir != "" && !filepath.IsAbs(c.Policies.Dir) {
		return filepath.Join(c.dir, c.Policies.Dir)
	}
	return c.Policies.Dir
}

// CostModel is the cost model's configuration: the prices, aliases and
// output reserve the file sets.
func (c *Config) CostModel() costmodel.Config {
	cc := costmodel.Config{FreeUnknown: c.Costs.FreeUnknown, OutputReserve: c.Costs.OutputReserve.FallbackPercent(), Aliases: c.Costs.Aliases,
		ServerContextTokens: c.Costs.ServerContextTokens, SearchResultTokens: c.Costs.SearchResultTokens}
	conv := func(p PriceConfig) costmodel.Price {
		return costmodel.Price{
			Input: costmodel.NanoUSD(p.Input), CachedInput: costmodel.NanoUSD(p.CachedInput),
			CacheWrite: costmodel.NanoUSD(p.CacheWrite), Output: costmodel.NanoUSD(p.Output),
			MaxOutputTokens: p.MaxOutputTokens,
			WebSearch:       costmodel.NanoUSD(p.WebSearch), FileSearch: costmodel.NanoUSD(p.FileSearch),
			Container:          costmodel.NanoUSD(p.Container),
			USInferencePercent: p.USInferencePercent, FastPercent: p.FastPercent,
		}
	}
	if len(c.Costs.Prices) > 0 {
		cc.Prices = make(map[string]costmodel.Price, len(c.Costs.Prices))
		for m, p := range c.Costs.Prices {
			cc.Prices[m] = conv(p)
		}
	}
	if c.Costs.DefaultPrice != nil {
		cc.DefaultPrice = conv(*c.Costs.DefaultPrice)
	}
	return cc
}

// EmbeddedPolicies tells whether the policies come from a file system
// given with WithPolicyFS (the embedded quickstart's) rather than a
// directory on disk.
func (c *Config) EmbeddedPolicies() bool { return c.policyFS != nil }
