// Package config is costgate's configuration file: its schema (Config and
// the sections under it), its defaults and its validation, which names the
// field at fault (FieldError). It reads and checks; the packages that run
// costgate compile it for their own use.
package config
