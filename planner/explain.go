package planner

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Explain writes the plan for a human: a header with the trigger, then the
// modules tier by tier with why each is in the plan and the commit it is
// built at, in aligned columns, then the external bases kept at their
// current digest. An empty plan says so in one line.
func (p Plan) Explain(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "plan %s: %s\n", p.ID, p.Trigger)
	if p.Empty() {
		fmt.Fprintf(ew, "nothing to build: %s\n", p.nothingReason())
		return ew.err
	}
	fmt.Fprintf(ew, "%s in %s", plural(len(p.Modules), "module"), plural(len(p.Tiers), "tier"))
	if len(p.External) > 0 {
		fmt.Fprintf(ew, ", %s kept at the current digest", plural(len(p.External), "external base"))
	}
	fmt.Fprintln(ew)
	fmt.Fprintln(ew)

	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tMODULE\tREASON\tCOMMIT")
	last := -1
	for _, n := range p.Modules {
		tier := ""
		if n.Tier != last {
			tier, last = fmt.Sprint(n.Tier), n.Tier
		}
		commit := "(current)"
		if n.Source.Commit != "" {
			commit = ShortCommit(n.Source.Commit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", tier, n.Module, n.Reason, commit)
	}
	tw.Flush()

	if len(p.External) > 0 {
		fmt.Fprintln(ew)
		tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EXTERNAL BASE\tNEEDED BY")
		for _, e := range p.External {
			fmt.Fprintf(tw, "%s\t%s\n", e.Module, strings.Join(e.NeededBy, ", "))
		}
		tw.Flush()
	}
	return ew.err
}

func (p Plan) nothingReason() string {
	t := p.Trigger
	switch {
	case t.Kind == KindPush && len(t.Paths) > 0:
		return fmt.Sprintf("no module is built from %s with a build path containing the changed paths", t.Repo)
	case t.Kind == KindPush:
		return fmt.Sprintf("no module is built from %s", t.Repo)
	default:
		return "the trigger selects no module"
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// errWriter keeps the first write error and drops everything after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}
