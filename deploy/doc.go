// Package deploy holds no Go code: it is the folder of costgate's
// deployment kit (compose.yaml, the stack's costgate.yaml and policies,
// Prometheus's scrape config and alert rules, Grafana's provisioning and
// dashboard), and its tests check that kit: the compose file against the
// Compose schema, the alert rules with promtool, and every dashboard and
// alert query against a real Prometheus scraping a real costgate. See
// README.md beside this file.
package deploy
