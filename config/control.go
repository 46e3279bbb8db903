package config

import (
	"net/url"
	"os"
	"slices"
	"time"
)

// ControlConfig tunes the control plane: tenants, teams, users and keys
// managed through the admin API, stored in the ledger's database, and the
// budget alerts (see package control).
type ControlConfig struct {
	// Disabled turns the control plane off: no table is created and the
	// admin API's control routes answer 404. Default false (on).
	Disabled bool `yaml:"disabled"`
	// ReadToken is a bearer token for the admin plane that may read and
	// never write (finance, support): its writes are 403. ReadTokenEnv
	// names an environment variable holding it instead. Default: none.
	ReadToken    string `yaml:"read_token"`
	ReadTokenEnv string `yaml:"read_token_env"`
	// Poll is how often each replica asks the database whether the
	// control plane's data changed. Default 250ms.
	Poll time.Duration `yaml:"poll"`
	// Alerts are the budget alert webhooks.
	Alerts AlertsConfig `yaml:"alerts"`
}

// AlertsConfig sends budget alerts to a webhook: when a control-plane
// budget's spend crosses one of Thresholds (and a budget's own soft
// threshold), and when a key expires.
type AlertsConfig struct {
	// URL receives the alerts (POST). Empty (the default) sends none.
	URL string `yaml:"url"`
	// Secret signs each delivery (HMAC-SHA256 over "TIMESTAMP.BODY");
	// SecretEnv names an environment variable holding it instead.
	// Required with URL.
	Secret    string `yaml:"secret"`
	SecretEnv string `yaml:"secret_env"`
	// Thresholds are percentages of a budget, 1 to 100. Default 50, 80, 100.
	Thresholds []int `yaml:"thresholds"`
	// Format is cloudevents (a structured CloudEvent, the default) or
	// slack (a Slack incoming-webhook message).
	Format string `yaml:"format"`
	// Timeout bounds one delivery. Default 5s.
	Timeout time.Duration `yaml:"timeout"`
	// Backoff is the delay before a failed delivery's first retry; each
	// retry doubles it (with up to 20% jitter), up to 5m. Default 1s.
	Backoff time.Duration `yaml:"backoff"`
	// MaxAttempts is how many times a delivery is tried before it is
	// given up (recorded as failed). Default 10.
	MaxAttempts int `yaml:"max_attempts"`
}

func (c *ControlConfig) applyDefaults() {
	if c.Poll == 0 {
		c.Poll = 250 * time.Millisecond
	}
	a := &c.Alerts
	if len(a.Thresholds) == 0 {
		a.Thresholds = []int{50, 80, 100}
	}
	if a.Format == "" {
		a.Format = "cloudevents"
	}
	if a.Timeout == 0 {
		a.Timeout = 5 * time.Second
	}
	if a.MaxAttempts == 0 {
		a.MaxAttempts = 10
	}
	if a.Backoff == 0 {
		a.Backoff = time.Second
	}
}

func (c ControlConfig) validate(bad func(path, format string, args ...any)) {
	if c.Poll < 10*time.Millisecond || c.Poll > time.Minute {
		bad("control.poll", "must be from 10ms to 1m, not %s", c.Poll)
	}
	if c.ReadToken != "" && c.ReadTokenEnv != "" {
		bad("control.read_token", "set read_token or read_token_env, not both")
	}
	a := c.Alerts
	for i, t := range a.Thresholds {
		if t < 1 || t > 100 {
			bad("control.alerts.thresholds", "item %d: %d is not a percentage from 1 to 100", i, t)
		}
	}
	if !slices.Contains([]string{"cloudevents", "slack"}, a.Format) {
		bad("control.alerts.format", "must be cloudevents or slack, not %q", a.Format)
	}
	if a.MaxAttempts < 1 {
		bad("control.alerts.max_attempts", "must be at least 1")
	}
	if a.Backoff < 10*time.Millisecond || a.Backoff > 5*time.Minute {
		bad("control.alerts.backoff", "must be from 10ms to 5m")
	}
	if a.Timeout <= 0 {
		bad("control.alerts.timeout", "must be positive")
	}
	if a.URL == "" {
		return
	}
	if u, err := url.Parse(a.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("control.alerts.url", "must be an http:// or https:// URL")
	}
	if a.Secret == "" && a.SecretEnv == "" {
		bad("control.alerts.secret", "required with control.alerts.url: deliveries are signed")
	}
}

// ReadOnlyToken is the admin plane's read-only token; empty for none.
func (c ControlConfig) ReadOnlyToken() string {
	if c.ReadTokenEnv != "" {
		return os.Getenv(c.ReadTokenEnv)
	}
	return c.ReadToken
}

// SigningSecret is the alerts' HMAC secret.
func (a AlertsConfig) SigningSecret() string {
	if a.SecretEnv != "" {
		return os.Getenv(a.SecretEnv)
	}
	return a.Secret
}
