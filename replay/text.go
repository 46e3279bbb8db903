package replay

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// WriteText prints r for an operator: the totals, then the changes by
// transition, policy and tenant, then the samples.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "replayed %d of %d captured requests from %d capture files", r.Replayed, r.Records, r.Files)
	if r.Truncated > 0 {
		fmt.Fprintf(tw, " (%d truncated records skipped)", r.Truncated)
	}
	fmt.Fprintf(tw, "\n%d would be decided differently, estimated cost %s\n", r.Changed, r.ChangedCost)
	if r.Changed == 0 {
		return tw.Flush()
	}
	fmt.Fprintln(tw, "\nTRANSITION\tREQUESTS\tCOST")
	for _, t := range r.Transitions {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", t.Name(), t.Count, t.Cost)
	}
	fmt.Fprintln(tw, "\nPOLICY\tREQUESTS\tCOST\tTRANSITIONS")
	for _, p := range r.Policies {
		names := make([]string, 0, len(p.Transitions))
		for n := range p.Transitions {
			names = append(names, n)
		}
		slices.Sort(names)
		fmt.Fprintf(tw, "%s\t%d\t%s\t", p.Policy, p.Count, p.Cost)
		for i, n := range names {
			if i > 0 {
				fmt.Fprint(tw, " ")
			}
			fmt.Fprintf(tw, "%s=%d", n, p.Transitions[n])
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw, "\nTENANT\tREQUESTS\tCOST")
	for _, t := range r.Tenants {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", t.Tenant, t.Count, t.Cost)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Transitions {
		fmt.Fprintf(w, "\n%s, e.g.:\n", t.Name())
		for _, s := range t.Samples {
			c := s.Input.Caller
			fmt.Fprintf(w, "  %s tenant=%s plan=%s model=%q max_output_tokens=%d: %s -> %s\n",
				s.RequestID, c.Tenant, c.Plan, s.Input.Request.Model, s.Input.Request.MaxOutputTokens, s.Old, s.New)
		}
	}
	return nil
}
