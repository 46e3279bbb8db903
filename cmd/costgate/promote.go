package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net/url"
	"strings"
)

// The policy promotion subcommands, through the admin API of a running
// costgate: list the policies' modes, replay and promote a shadow policy,
// demote it.

const promoteUsage = `usage: costgate policy list
       costgate policy promote ID [--since 24h] [--tenant T]     replays the capture with ID enforced; prints the report, its replay_id and report_sha256
       costgate policy promote ID --replay REPLAY_ID --ack SHA256 enforces ID on every replica, acknowledging that report
       costgate policy demote ID [--reason TEXT]
Each takes --admin URL (default $COSTGATE_ADMIN_URL) and --token TOKEN (default $COSTGATE_ADMIN_TOKEN).`

func policyPromote(ctx context.Context, action string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("policy "+action, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base, token := adminFlags(fs)
	since := fs.String("since", "", "replay the requests captured within this duration")
	tenant := fs.String("tenant", "", "replay one tenant's requests")
	replayID := fs.String("replay", "", "the replay to acknowledge (promote)")
	ack := fs.String("ack", "", "the replay's report_sha256 (promote)")
	reason := fs.String("reason", "", "why (demote)")
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return errors.New(promoteUsage)
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return errors.New(promoteUsage)
	}
	c := &adminClient{base: *base, token: *token, out: stdout}
	path := "/admin/v1/policies/" + url.PathEscape(id)
	switch {
	case action == "list" && id == "":
		return c.do(ctx, "GET", "/admin/v1/policies", nil)
	case id == "":
		return errors.New(promoteUsage)
	case action == "demote":
		return c.do(ctx, "POST", path+"/demote", map[string]string{"reason": *reason})
	case *replayID == "" && *ack == "":
		return c.do(ctx, "POST", path+"/promote/replay", map[string]string{"since": *since, "tenant": *tenant})
	case *replayID == "" || *ack == "":
		return errors.New("costgate policy promote: --replay and --ack go together (run it without them first for the replay)")
	default:
		return c.do(ctx, "POST", path+"/promote", map[string]string{"replay_id": *replayID, "acknowledge_sha256": *ack})
	}
}
