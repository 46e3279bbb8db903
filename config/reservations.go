package config

import (
	"os"
	"time"
)

// ReservationsConfig tunes the reserve/settle API (POST /v1/costgate/reserve,
// /settle, /release).
type ReservationsConfig struct {
	// Secret signs reservation ids, which carry the reservation itself so
	// that any replica can settle it. Replicas that share a limiter store
	// must share the secret. Default: SecretEnv's value; else a random key
	// kept in data_dir/reservation.key, which suits one node.
	Secret string `yaml:"secret"`
	// SecretEnv names an environment variable that holds Secret.
	SecretEnv string `yaml:"secret_env"`
	// DefaultTTL is how long a reservation lives when its request names no
	// ttl. Default 5m.
	DefaultTTL time.Duration `yaml:"default_ttl"`
	// MaxTTL bounds the ttl a request may ask for. Default 1h.
	MaxTTL time.Duration `yaml:"max_ttl"`
}

// MinSecretLen is the shortest Secret accepted, in bytes.
const MinSecretLen = 16

func (r *ReservationsConfig) applyDefaults() {
	if r.DefaultTTL == 0 {
		r.DefaultTTL = 5 * time.Minute
	}
	if r.MaxTTL == 0 {
		r.MaxTTL = time.Hour
	}
}

// SigningSecret is the secret from the file or its environment variable;
// empty when neither sets one.
func (r ReservationsConfig) SigningSecret() string {
	if r.Secret != "" {
		return r.Secret
	}
	if r.SecretEnv != "" {
		return os.Getenv(r.SecretEnv)
	}
	return ""
}

func (r ReservationsConfig) validate(bad func(path, format string, args ...any)) {
	if r.Secret != "" && len(r.Secret) < MinSecretLen {
		bad("reservations.secret", "must be at least %d bytes", MinSecretLen)
	}
	if r.DefaultTTL < time.Second {
		bad("reservations.default_ttl", "must be at least 1s")
	}
	if r.MaxTTL < r.DefaultTTL {
		bad("reservations.max_ttl", "must be at least default_ttl (%s)", r.DefaultTTL)
	}
}
