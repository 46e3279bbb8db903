package config

import "path/filepath"

// CaptureConfig records the policy input of requests, with the decision
// taken, to a capture log that `costgate policy replay` evaluates a
// candidate policy directory against (see package replay).
type CaptureConfig struct {
	// Enabled turns capture on. Default false.
	Enabled bool `yaml:"enabled"`
	// Sample is the share of requests recorded, in (0, 1]. Default 1 (0
	// means the default: to record nothing, leave Enabled false).
	Sample float64 `yaml:"sample"`
	// Dir holds the capture files, relative to the config file. Default
	// data_dir/capture.
	Dir string `yaml:"dir"`
	// MaxBytes is the size at which a capture file is closed and the next
	// one started, in bytes. Default 64 MiB.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxFiles is how many capture files are kept; the oldest is removed
	// when a new one would exceed it. Default 8.
	MaxFiles int `yaml:"max_files"`
}

func (c *CaptureConfig) applyDefaults() {
	if c.Sample == 0 {
		c.Sample = 1
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 64 << 20
	}
	if c.MaxFiles == 0 {
		c.MaxFiles = 8
	}
}

func (c CaptureConfig) validate(bad func(path, format string, args ...any)) {
	if c.Sample <= 0 || c.Sample > 1 {
		bad("capture.sample", "must be in (0, 1], not %v", c.Sample)
	}
	if c.MaxBytes < 4096 {
		bad("capture.max_bytes", "must be at least 4096 bytes")
	}
	if c.MaxFiles < 1 {
		bad("capture.max_files", "must be at least 1")
	}
}

// CaptureDir is where the capture files live: capture.dir resolved against
// the config file's directory, else data_dir/capture.
func (c *Config) CaptureDir() string {
	if c.Capture.Dir == "" {
		return filepath.Join(c.dataDir(), "capture")
	}
	if c.dir != "" && !filepath.IsAbs(c.Capture.Dir) {
		return filepath.Join(c.dir, c.Capture.Dir)
	}
	return c.Capture.Dir
}
