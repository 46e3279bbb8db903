package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// The control plane's subcommands: keys, tenants, teams, users and
// budgets, through the admin API of a running costgate.

const controlUsage = `usage: costgate keys create --tenant T [--team TEAM] [--user USER] [--budget 1.00/day]... [--model M]... [--route R]... [--expires TIME]
       costgate keys list [--tenant T [--team TEAM] [--user USER]] [--after ID] [--limit N]
       costgate keys get ID | costgate keys levels ID
       costgate keys rotate ID [--grace 1h]
       costgate keys revoke ID
       costgate tenants create NAME [--plan P] [--budget 100/month]...
       costgate tenants list | costgate tenants get NAME | costgate tenants disable NAME | costgate tenants enable NAME
       costgate teams create --tenant T NAME [--budget 10/day]...   (users alike: costgate users ...)
       costgate teams list [--tenant T] | costgate teams get ID
       costgate budgets reset KIND ID BUDGET          (KIND: tenant, team, user or key; BUDGET: the budget's id, such as day)
       costgate budgets raise KIND ID BUDGET --amount 5.00 (--for 24h | --until TIME)
       costgate budgets show KEY_ID                   (every level's budget and limit, the closest to refusing marked)
       costgate audit [--entity ID] [--tenant T] [--limit N]
Every command takes --admin URL (default $COSTGATE_ADMIN_URL, else http://127.0.0.1:9090)
and --token TOKEN (default $COSTGATE_ADMIN_TOKEN); it prints the API's JSON answer.`

// adminClient talks to the admin API.
type adminClient struct {
	base, token string
	out         io.Writer
}

// adminFlags registers --admin and --token on fs.
func adminFlags(fs *flag.FlagSet) (base, token *string) {
	def := os.Getenv("COSTGATE_ADMIN_URL")
	if def == "" {
		def = "http://127.0.0.1:9090"
	}
	base = fs.String("admin", def, "the admin API's base URL")
	token = fs.String("token", os.Getenv("COSTGATE_ADMIN_TOKEN"), "the admin token (or the read-only token, for reads)")
	return base, token
}

// do sends one request and prints the answer; a status of 400 or more
// is an error that carries the API's message.
func (c *adminClient) do(ctx context.Context, method, path string, body any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	if c.token == "" {
		return errors.New("no admin token: set --token or COSTGATE_ADMIN_TOKEN")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.base, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	if u := os.Getenv("USER"); u != "" {
		req.Header.Set("Costgate-Actor", u)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("admin API: %d: %s", resp.StatusCode, e.Error.Message)
		}
		return fmt.Errorf("admin API: %s", resp.Status)
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, b, "", "  ") != nil {
		_, err = c.out.Write(b)
		return err
	}
	_, err = c.out.Write(pretty.Bytes())
	return err
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

type budgetJSON struct {
	AmountUSD string `json:"amount_usd"`
	Period    string `json:"period"`
}

// budgets reads --budget AMOUNT/PERIOD values.
func budgets(vals []string) ([]budgetJSON, error) {
	out := []budgetJSON{}
	for _, v := range vals {
		amount, period, ok := strings.Cut(v, "/")
		if !ok || amount == "" || period == "" {
			return nil, fmt.Errorf("--budget %q: want AMOUNT/PERIOD, such as 1.00/day, 100/month or 5/72h", v)
		}
		out = append(out, budgetJSON{AmountUSD: strings.TrimPrefix(amount, "$"), Period: period})
	}
	return out, nil
}

// controlCmd runs keys, tenants, teams, users, budgets and audit.
func controlCmd(ctx context.Context, noun string, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(controlUsage)
	}
	verb, rest := args[0], args[1:]
	fs := flag.NewFlagSet(noun+" "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base, token := adminFlags(fs)
	var (
		tenant, team, user, expires, plan, grace, after, entity, amount, forDur, until string
		limit                                                                          int
		budgetVals, models, routes                                                     multi
	)
	fs.StringVar(&tenant, "tenant", "", "tenant")
	fs.StringVar(&team, "team", "", "team (by name)")
	fs.StringVar(&user, "user", "", "user (by name)")
	fs.StringVar(&expires, "expires", "", "expiry, RFC 3339")
	fs.StringVar(&plan, "plan", "", "a tenant's plan")
	fs.StringVar(&grace, "grace", "1h", "how long a rotated key's old secret stays valid")
	fs.StringVar(&after, "after", "", "the previous page's last id")
	fs.StringVar(&entity, "entity", "", "an entity's id")
	fs.StringVar(&amount, "amount", "", "a raised budget's amount in dollars")
	fs.StringVar(&forDur, "for", "", "how long a raise lasts")
	fs.StringVar(&until, "until", "", "when a raise ends, RFC 3339")
	fs.IntVar(&limit, "limit", 100, "page size")
	fs.Var(&budgetVals, "budget", "AMOUNT/PERIOD, repeatable")
	fs.Var(&models, "model", "an allowed model, repeatable")
	fs.Var(&routes, "route", "an allowed route, repeatable")
	// Flags may come before or after the positional arguments.
	var pos []string
	for {
		if err := fs.Parse(rest); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", noun, verb, err, controlUsage)
		}
		if fs.NArg() == 0 {
			break
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	c := &adminClient{base: *base, token: *token, out: stdout}
	arg := func(n int) (string, error) {
		if len(pos) != n+1 {
			return "", fmt.Errorf("%s %s takes %d argument(s)\n%s", noun, verb, n+1, controlUsage)
		}
		return pos[n], nil
	}
	one := func() (string, error) {
		if len(pos) != 1 {
			return "", fmt.Errorf("%s %s takes one argument\n%s", noun, verb, controlUsage)
		}
		return url.PathEscape(pos[0]), nil
	}
	bs, err := budgets(budgetVals)
	if err != nil {
		return err
	}
	list := func(seg string) error {
		q := url.Values{}
		for k, v := range map[string]string{"tenant": tenant, "team": team, "user": user, "after": after} {
			if v != "" {
				q.Set(k, v)
			}
		}
		q.Set("limit", fmt.Sprint(limit))
		return c.do(ctx, "GET", "/admin/v1/"+seg+"?"+q.Encode(), nil)
	}
	switch noun + " " + verb {
	case "keys create":
		body := map[string]any{"tenant": tenant, "budgets": bs}
		for k, v := range map[string]string{"team": team, "user": user, "expires_at": expires} {
			if v != "" {
				body[k] = v
			}
		}
		if len(models) > 0 {
			body["models"] = models
		}
		if len(routes) > 0 {
			body["routes"] = routes
		}
		return c.do(ctx, "POST", "/admin/v1/keys", body)
	case "keys list", "tenants list", "teams list", "users list":
		return list(noun)
	case "keys get", "tenants get", "teams get", "users get":
		id, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "GET", "/admin/v1/"+noun+"/"+id, nil)
	case "keys levels", "budgets show":
		id, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "GET", "/admin/v1/keys/"+id+"/levels", nil)
	case "keys rotate":
		id, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/admin/v1/keys/"+id+"/rotate", map[string]string{"grace": grace})
	case "keys revoke":
		id, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "DELETE", "/admin/v1/keys/"+id, nil)
	case "tenants create":
		name, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/admin/v1/tenants", map[string]any{"name": name, "plan": plan, "budgets": bs})
	case "tenants disable", "tenants enable":
		name, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "PATCH", "/admin/v1/tenants/"+name, map[string]bool{"active": verb == "enable"})
	case "teams create", "users create":
		name, err := one()
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/admin/v1/"+noun, map[string]any{"tenant": tenant, "name": name, "budgets": bs})
	case "budgets reset", "budgets raise":
		if _, err := arg(2); err != nil {
			return err
		}
		seg := map[string]string{"tenant": "tenants", "team": "teams", "user": "users", "key": "keys"}[pos[0]]
		if seg == "" {
			return fmt.Errorf("budgets %s: KIND %q: want tenant, team, user or key", verb, pos[0])
		}
		path := "/admin/v1/" + seg + "/" + url.PathEscape(pos[1]) + "/budgets/" + url.PathEscape(pos[2]) + "/" + verb
		if verb == "reset" {
			return c.do(ctx, "POST", path, nil)
		}
		body := map[string]string{"amount_usd": amount}
		if forDur != "" {
			body["for"] = forDur
		}
		if until != "" {
			body["until"] = until
		}
		return c.do(ctx, "POST", path, body)
	case "audit list":
		q := url.Values{"limit": {fmt.Sprint(limit)}}
		if entity != "" {
			q.Set("entity", entity)
		}
		if tenant != "" {
			q.Set("tenant", tenant)
		}
		return c.do(ctx, "GET", "/admin/v1/audit?"+q.Encode(), nil)
	}
	return fmt.Errorf("unknown command %s %s\n%s", noun, verb, controlUsage)
}
