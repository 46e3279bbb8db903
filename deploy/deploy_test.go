package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// tool returns the path of an executable the test needs. Without it the
// test fails under CI (CI set) and is skipped elsewhere, with the reason.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("%s is not on PATH (Debian: apt-get install prometheus)", name)
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so a missing tool fails: %s", msg)
		}
		t.Skip(msg)
	}
	return p
}

// readYAML decodes a YAML file of the kit into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// alertRule is one alerting rule of prometheus/alerts.yml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, "prometheus/alerts.yml", &f)
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("prometheus/alerts.yml has no rule")
	}
	return rules
}

func TestPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPrometheusConfig checks prometheus.yml with promtool (its rule file
// taken from here rather than the container's path) and that it scrapes
// every costgate replica of compose.yaml on the admin port of
// costgate.yaml, with the admin token's secret that compose mounts.
func TestPrometheusConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	b, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := filepath.Abs("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	const inContainer = "/etc/prometheus/alerts.yml"
	if !bytes.Contains(b, []byte(inContainer)) {
		t.Fatalf("prometheus.yml does not load %s", inContainer)
	}
	// promtool also wants the token's file: the secrets' folder is a
	// temporary one holding a token.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "costgate_admin_token"), []byte("token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b = bytes.ReplaceAll(b, []byte(inContainer), []byte(rules))
	b = bytes.ReplaceAll(b, []byte("/run/secrets/"), []byte(dir+"/"))
	local := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(local, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", local).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}

	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			Authorization struct {
				CredentialsFile string `yaml:"credentials_file"`
			} `yaml:"authorization"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &prom)
	var cg struct {
		AdminListen string `yaml:"admin_listen"`
	}
	readYAML(t, "costgate.yaml", &cg)
	_, adminPort, _ := strings.Cut(cg.AdminListen, ":")
	var compose struct {
		Services map[string]struct {
			Secrets []string `yaml:"secrets"`
		} `yaml:"services"`
	}
	readYAML(t, "compose.yaml", &compose)

	var replicas []string
	for name := range compose.Services {
		if strings.HasPrefix(name, "costgate-") {
			replicas = append(replicas, name+":"+adminPort)
		}
	}
	slices.Sort(replicas)
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName != "costgate" {
			continue
		}
		var targets []string
		for _, s := range sc.StaticConfigs {
			targets = append(targets, s.Targets...)
		}
		slices.Sort(targets)
		if !slices.Equal(targets, replicas) {
			t.Errorf("job costgate scrapes %v, want the replicas' admin listeners %v", targets, replicas)
		}
		secret, ok := strings.CutPrefix(sc.Authorization.CredentialsFile, "/run/secrets/")
		if !ok || !slices.Contains(compose.Services["prometheus"].Secrets, secret) {
			t.Errorf("job costgate's credentials_file %q is not a secret compose mounts into prometheus", sc.Authorization.CredentialsFile)
		}
		return
	}
	t.Error("prometheus.yml has no job costgate")
}

// TestAlertTestsCoverEveryAlert requires alerts_test.yml to make every
// alert fire (a case expecting it) and stay quiet (a case expecting none).
func TestAlertTestsCoverEveryAlert(t *testing.T) {
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, "prometheus/alerts_test.yml", &f)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, c := range tc.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				quiet[c.Alertname] = true
			}
		}
	}
	for _, r := range alertRules(t) {
		if !fires[r.Alert] {
			t.Errorf("%s: no case in alerts_test.yml expects it to fire", r.Alert)
		}
		if !quiet[r.Alert] {
			t.Errorf("%s: no case in alerts_test.yml expects it to stay quiet", r.Alert)
		}
	}
}

// TestAlertRunbooks requires each alert's summary, description, severity
// and a runbook_url whose anchor is a heading of README.md.
func TestAlertRunbooks(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(readme))
	const base = "https://github.com/costgate/costgate/blob/main/deploy/README.md#"
	for _, r := range alertRules(t) {
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: needs a summary and a description", r.Alert)
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s: needs a severity label", r.Alert)
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], base)
		if !ok {
			t.Errorf("%s: runbook_url %q is not %s<anchor>", r.Alert, r.Annotations["runbook_url"], base)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("%s: runbook_url anchor #%s is no heading of deploy/README.md", r.Alert, anchor)
		}
	}
}

// headingAnchors returns the anchors GitHub gives a Markdown file's
// headings: lower case, punctuation dropped, spaces as hyphens.
func headingAnchors(md string) map[string]bool {
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for line := range strings.SplitSeq(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		h = drop.ReplaceAllString(strings.ToLower(h), "")
		anchors[strings.ReplaceAll(h, " ", "-")] = true
	}
	return anchors
}

// composeSchema compiles the vendored Compose schema.
func composeSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("compose-spec.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatalf("compose-spec.json: %v", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("compose-spec.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("compose-spec.json")
	if err != nil {
		t.Fatalf("compose-spec.json: %v", err)
	}
	return s
}

// composeDoc decodes compose YAML (anchors and merge keys resolved) into
// the JSON value model the schema validator takes.
func composeDoc(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("compose: %v", err)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("compose: %v", err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := doc.(map[string]any)
	if !ok {
		t.Fatalf("compose: the top level is %T, not a mapping", doc)
	}
	return m
}

// composeProblems lists what is wrong in a compose document beyond its
// schema: a service that names an undeclared secret, named volume, network
// or service; a bind mount or secret file (apart from ./secrets/, which the
// operator creates) missing from dir.
func composeProblems(doc map[string]any, dir string) []string {
	var problems []string
	declared := func(kind string) map[string]any {
		m, _ := doc[kind].(map[string]any)
		return m
	}
	secrets, volumes, networks, services := declared("secrets"), declared("volumes"), declared("networks"), declared("services")
	names := func(v any, key string) []string {
		var out []string
		switch v := v.(type) {
		case []any:
			for _, e := range v {
				switch e := e.(type) {
				case string:
					out = append(out, e)
				case map[string]any:
					if s, ok := e[key].(string); ok {
						out = append(out, s)
					}
				}
			}
		case map[string]any:
			for k := range v {
				out = append(out, k)
			}
		}
		return out
	}
	for name, sv := range services {
		svc, _ := sv.(map[string]any)
		for _, s := range names(svc["secrets"], "source") {
			if _, ok := secrets[s]; !ok {
				problems = append(problems, fmt.Sprintf("services.%s.secrets: %q is not declared under secrets", name, s))
			}
		}
		for _, n := range names(svc["networks"], "") {
			if _, ok := networks[n]; !ok {
				problems = append(problems, fmt.Sprintf("services.%s.networks: %q is not declared under networks", name, n))
			}
		}
		for _, d := range names(svc["depends_on"], "") {
			if _, ok := services[d]; !ok {
				problems = append(problems, fmt.Sprintf("services.%s.depends_on: %q is no service", name, d))
			}
		}
		for _, v := range names(svc["volumes"], "source") {
			src, _, _ := strings.Cut(v, ":")
			switch {
			case strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/"):
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					problems = append(problems, fmt.Sprintf("services.%s.volumes: bind mount %s: %v", name, src, err))
				}
			default:
				if _, ok := volumes[src]; !ok {
					problems = append(problems, fmt.Sprintf("services.%s.volumes: %q is not declared under volumes", name, src))
				}
			}
		}
	}
	for name, sv := range secrets {
		s, _ := sv.(map[string]any)
		file, _ := s["file"].(string)
		if file == "" || strings.HasPrefix(filepath.Clean(file), "secrets/") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
			problems = append(problems, fmt.Sprintf("secrets.%s.file: %v", name, err))
		}
	}
	slices.Sort(problems)
	return problems
}

func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := composeDoc(t, b)
	if err := composeSchema(t).Validate(doc); err != nil {
		t.Fatalf("compose.yaml does not match the Compose schema: %v", err)
	}
	for _, p := range composeProblems(doc, ".") {
		t.Error(p)
	}

	// No credential is written in the file: the admin token, the database
	// and Grafana passwords are required variables, the keys are secrets.
	text := string(b)
	for _, demo := range []string{"cg-demo", "cg_demo"} {
		if strings.Contains(text, demo) {
			t.Errorf("compose.yaml contains the demo credential %q", demo)
		}
	}
	for _, v := range []string{"COSTGATE_ADMIN_TOKEN", "POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD"} {
		if !strings.Contains(text, "${"+v+":?") {
			t.Errorf("compose.yaml does not require %s with ${%s:?message}", v, v)
		}
	}

	services := doc["services"].(map[string]any)
	for _, want := range []string{"costgate-1", "costgate-2", "redis", "postgres", "prometheus", "grafana"} {
		if _, ok := services[want]; !ok {
			t.Errorf("compose.yaml has no service %s", want)
		}
	}
	dataVolumes := map[string]string{}
	for name, sv := range services {
		svc := sv.(map[string]any)
		if r, _ := svc["restart"].(string); r != "no" && svc["healthcheck"] == nil {
			t.Errorf("services.%s: a long-running service needs a healthcheck", name)
		}
		if !strings.HasPrefix(name, "costgate-") {
			continue
		}
		build, _ := svc["build"].(map[string]any)
		if build["context"] != ".." || build["dockerfile"] != "Dockerfile" {
			t.Errorf("services.%s: not built from the repository's Dockerfile: %v", name, build)
		}
		env, _ := svc["environment"].(map[string]any)
		for _, v := range []string{"COSTGATE_ADMIN_TOKEN", "REDIS_URL", "DATABASE_URL"} {
			if env[v] == nil {
				t.Errorf("services.%s: environment lacks %s", name, v)
			}
		}
		for _, v := range svc["volumes"].([]any) {
			src, target, _ := strings.Cut(v.(string), ":")
			target, _, _ = strings.Cut(target, ":")
			if target == "/home/nonroot" {
				if other, ok := dataVolumes[src]; ok {
					t.Errorf("services.%s and %s share the data volume %s", name, other, src)
				}
				dataVolumes[src] = name
			}
		}
	}
	if len(dataVolumes) != 2 {
		t.Errorf("want one data volume per costgate replica, got %v", dataVolumes)
	}
}

// TestComposeChecksCatchMistakes shows that the schema and the reference
// checks reject what they are there to reject.
func TestComposeChecksCatchMistakes(t *testing.T) {
	schema := composeSchema(t)
	tests := []struct {
		name, yaml string
		schema     bool   // the schema rejects it
		problem    string // else composeProblems reports this
	}{
		{name: "no services", yaml: "volumes: {v: {}}\n", schema: true},
		{name: "misspelt attribute", yaml: "services: {a: {image: x, healthchek: {test: [CMD, true]}}}\n", schema: true},
		{name: "no image nor build", yaml: "services: {a: {command: [x]}}\n", schema: true},
		{name: "bad depends_on condition", yaml: "services: {a: {image: x, depends_on: {b: {condition: started}}}, b: {image: x}}\n", schema: true},
		{name: "secret without a source", yaml: "services: {a: {image: x}}\nsecrets: {s: {name: s}}\n", schema: true},
		{name: "bad duration", yaml: "services: {a: {image: x, healthcheck: {interval: soon}}}\n", schema: true},
		{name: "undeclared secret", yaml: "services: {a: {image: x, secrets: [token]}}\n", problem: `services.a.secrets: "token" is not declared under secrets`},
		{name: "undeclared volume", yaml: "services: {a: {image: x, volumes: [\"data:/data\"]}}\n", problem: `services.a.volumes: "data" is not declared under volumes`},
		{name: "undeclared network", yaml: "services: {a: {image: x, networks: [back]}}\n", problem: `services.a.networks: "back" is not declared under networks`},
		{name: "unknown dependency", yaml: "services: {a: {image: x, depends_on: [b]}}\n", problem: `services.a.depends_on: "b" is no service`},
		{name: "missing bind mount", yaml: "services: {a: {image: x, volumes: [\"./nowhere.yml:/x\"]}}\n", problem: "services.a.volumes: bind mount ./nowhere.yml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := composeDoc(t, []byte(tc.yaml))
			err := schema.Validate(doc)
			if tc.schema {
				if err == nil {
					t.Fatal("the schema accepted it")
				}
				return
			}
			if err != nil {
				t.Fatalf("the schema rejected it: %v", err)
			}
			problems := composeProblems(doc, ".")
			if len(problems) != 1 || !strings.HasPrefix(problems[0], tc.problem) {
				t.Fatalf("problems %q, want one starting %q", problems, tc.problem)
			}
		})
	}
}

// TestGrafanaProvisioning checks that the dashboard uses the provisioned
// datasource and that the provider loads the folder compose mounts.
func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		Datasources []struct {
			UID, Type, URL string
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Fatalf("datasources: %+v, want the stack's Prometheus", ds.Datasources)
	}
	uid := ds.Datasources[0].UID

	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/costgate.yml", &prov)
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(prov.Providers) != 1 || !strings.Contains(string(b), "./grafana/dashboards:"+prov.Providers[0].Options.Path+":ro") {
		t.Errorf("the dashboard provider's path is not where compose.yaml mounts grafana/dashboards: %+v", prov.Providers)
	}

	d := dashboard(t)
	if len(d.Panels) == 0 {
		t.Fatal("the dashboard has no panel")
	}
	for _, p := range d.Panels {
		if p.Datasource.UID != uid {
			t.Errorf("panel %q: datasource uid %q, want %q", p.Title, p.Datasource.UID, uid)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
}

type panel struct {
	Title      string `json:"title"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboardJSON struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func dashboard(t *testing.T) dashboardJSON {
	t.Helper()
	b, err := os.ReadFile("grafana/dashboards/costgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboardJSON
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("costgate.json: %v", err)
	}
	return d
}
