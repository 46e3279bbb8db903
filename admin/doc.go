// Package admin is costgate's admin plane: health and readiness, the
// Prometheus metrics, the admin API (spend, ledger export, limits, top
// throttled keys, shadow decisions, reload) and the dashboard, on the
// gate that the front doors share. Everything but /healthz, /readyz and
// the dashboard's page needs the admin token.
package admin
