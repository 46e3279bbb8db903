// Command costgate is the cost-aware rate limiter and proxy: one binary for
// the server and its operator subcommands. Run `costgate help` for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `costgate: a cost-aware rate limiter and proxy for LLM and metered APIs

Usage:
  costgate serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--redis URL] [--ledger DSN] [--data-dir DIR]
  costgate simulate [--listen ADDR] [--latency D] [--token-interval D] [--error-rate F]
  costgate demo [--duration D] [--exit]
  costgate estimate --route R [--model M] [--method M] [--config FILE] < body.json
  costgate policy check DIR
  costgate policy test DIR
  costgate policy replay --policies DIR [--since 24h] [--tenant T] [--format text|json] [--capture DIR] [--config FILE]
  costgate policy list | costgate policy promote ID [--replay ID --ack SHA256] | costgate policy demote ID
  costgate ledger export --tenant T --from DATE --to DATE [--format csv|json|cloudevents] [--config FILE | --ledger DSN | --data-dir DIR]
  costgate ledger nodes [--config FILE | --ledger DSN | --data-dir DIR]
  costgate ledger recover --node ID --before TIME [--config FILE | --ledger DSN | --data-dir DIR]
  costgate keys create|list|get|levels|rotate|revoke ...   (the control plane, through the admin API)
  costgate tenants|teams|users create|list|get ...
  costgate budgets reset|raise|show ...
  costgate audit [--entity ID] [--tenant T]
  costgate version

With no --config, serve runs COSTGATE_CONFIG, else the quickstart embedded in the binary.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "costgate:", err)
		os.Exit(1)
	}
}

// run dispatches a command line; it is main without the process.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, stderr)
	case "simulate":
		return simulate(ctx, rest, stderr)
	case "demo":
		return demo(ctx, rest, stdout, stderr)
	case "estimate":
		return estimate(rest, stdin, stdout, stderr)
	case "policy":
		return policy(ctx, rest, stdout)
	case "ledger":
		return ledgerCmd(ctx, rest, stdout)
	case "keys", "tenants", "teams", "users", "budgets":
		return controlCmd(ctx, cmd, rest, stdout)
	case "audit":
		return controlCmd(ctx, cmd, append([]string{"list"}, rest...), stdout)
	case "version":
		return version(stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}
