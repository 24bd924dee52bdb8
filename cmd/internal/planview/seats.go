package planview

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/meshbuild/meshbuild/deploy"
)

// PrintSeats prints seats as `builds seats` shows them: each seat's scope,
// the modules holding it, the nodes they are assigned to, who holds it now
// by its claim, and its queue.
func PrintSeats(w io.Writer, seats []deploy.SeatView) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEAT\tSCOPE\tMODULES\tASSIGNED\tHELD BY\tQUEUED\tIN FLIGHT\tWAITING")
	for _, s := range seats {
		var holders []string
		for _, h := range s.Holders {
			state := "offline"
			if h.Online {
				state = "online"
			}
			holders = append(holders, fmt.Sprintf("%s (%s, since %s)", h.Node, state, h.Since.Local().Format("2006-01-02 15:04")))
		}
		var held []string
		for _, c := range s.Claims {
			where := ""
			if c.Node != "" {
				where = c.Node + ": "
			}
			held = append(held, fmt.Sprintf("%s%s since %s", where, c.Holder, c.Since.Local().Format("15:04:05")))
		}
		queued, inFlight, waiting := "-", "-", "-"
		if s.Accepts {
			queued, inFlight, waiting = fmt.Sprint(s.Queued), fmt.Sprint(s.InFlight), fmt.Sprint(s.Waiting)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Seat, s.Scope, dash(strings.Join(s.Modules, ",")),
			dash(strings.Join(holders, " ")), dash(strings.Join(held, "; ")), queued, inFlight, waiting)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
