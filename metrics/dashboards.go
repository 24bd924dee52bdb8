package metrics

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

//go:embed dashboards/*.json
var dashboardFiles embed.FS

// Dashboards returns the Grafana dashboards as files (meshbuild-*.json at
// the root), to write out or serve for provisioning.
func Dashboards() fs.FS {
	sub, err := fs.Sub(dashboardFiles, "dashboards")
	if err != nil {
		panic(err) // the embedded directory is always there
	}
	return sub
}

// Panel is one PromQL query of a dashboard panel. Expressions may use
// Grafana's $__rate_interval and $__range.
type Panel struct {
	Dashboard string // the dashboard's file name
	Title     string // the panel's title
	Expr      string
}

// DashboardQueries returns every panel's PromQL expressions, one Panel per
// query, in file and panel order.
func DashboardQueries() ([]Panel, error) {
	names, err := fs.Glob(dashboardFiles, "dashboards/*.json")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []Panel
	for _, name := range names {
		data, err := dashboardFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		var d struct {
			Panels []jsonPanel `json:"panels"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return nil, fmt.Errorf("reading dashboard %s: %w", name, err)
		}
		file := path.Base(name)
		var walk func([]jsonPanel)
		walk = func(ps []jsonPanel) {
			for _, p := range ps {
				for _, t := range p.Targets {
					if t.Expr != "" {
						out = append(out, Panel{Dashboard: file, Title: p.Title, Expr: t.Expr})
					}
				}
				walk(p.Panels) // a collapsed row holds its panels
			}
		}
		walk(d.Panels)
	}
	return out, nil
}

type jsonPanel struct {
	Title   string                  `json:"title"`
	Targets []struct{ Expr string } `json:"targets"`
	Panels  []jsonPanel             `json:"panels"`
}
