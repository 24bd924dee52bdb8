package metrics_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshbuild/meshbuild/deploy"
	"github.com/meshbuild/meshbuild/mesh"
	"github.com/meshbuild/meshbuild/metrics"
)

// exported gathers the name of every series family the package exports,
// and those the node runtime and the fleet's controller export (package
// deploy), histograms with their _bucket, _sum and _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	metrics.NewAgent(reg, "m1")
	// A running plan, for its remaining-time series to be gathered.
	c := metrics.NewController(reg)
	c.PlansRemaining(map[string]time.Duration{"p-1": time.Minute})
	// A module started, for the scheduler's histogram to be gathered.
	c.Dispatched(10, "https://git.example/fleet", time.Second)
	// The held plans' modules by state.
	c.Modules(map[string]int{"built": 1})
	reg.MustRegister(metrics.NewQueueCollector(raisedQueue(t), []string{mesh.BuildSeat}))
	// A node's own (mesh-node's /metrics), and the controller's view of
	// its nodes with one node seen and one report settled, for their
	// series to be gathered.
	deploy.NewMetrics(reg, "n1")
	fleet := deploy.NewMetrics(reg, "")
	fleet.NodeSeen("n1", 2, 1, time.Now())
	fleet.Report(deploy.Heartbeat, "heard")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[f.GetName()+s] = true
			}
		}
	}
	return out
}

var (
	metricName = regexp.MustCompile(`meshbuild_[a-z_]+`)
	variable   = regexp.MustCompile(`\$\{?[A-Za-z_]+\}?`)
)

func TestEveryPanelQueriesMetricsThePackageExports(t *testing.T) {
	panels, err := metrics.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	used := map[string]bool{}
	dashboards := map[string]bool{}
	for _, p := range panels {
		dashboards[p.Dashboard] = true
		if p.Title == "" || p.Expr == "" {
			t.Errorf("%s: a panel without a title or a query: %+v", p.Dashboard, p)
		}
		found := metricName.FindAllString(p.Expr, -1)
		if len(found) == 0 {
			t.Errorf("%s %q: %s queries no meshbuild metric", p.Dashboard, p.Title, p.Expr)
		}
		for _, n := range found {
			if !names[n] {
				t.Errorf("%s %q: %s is not a metric the package exports", p.Dashboard, p.Title, n)
			}
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
		}
		for _, v := range variable.FindAllString(p.Expr, -1) {
			if v != "$__rate_interval" && v != "$__range" {
				t.Errorf("%s %q: variable %s: only $__rate_interval and $__range are used", p.Dashboard, p.Title, v)
			}
		}
	}
	if len(dashboards) != 2 {
		t.Errorf("queries from %d dashboards, want 2: %v", len(dashboards), dashboards)
	}
	for n := range names {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if !used[base] && base != "meshbuild_queue_up" {
			t.Errorf("%s is exported but no panel shows it", base)
		}
	}
}

// The parts of a dashboard Grafana's import needs and the panels rely on.
type importable struct {
	ID         *int   `json:"id"`
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Schema     int    `json:"schemaVersion"`
	Templating struct {
		List []struct{ Name, Type, Query string } `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int
		Type       string
		Title      string
		Datasource *struct{ Type, UID string }
		GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
		Targets    []struct {
			RefID      string `json:"refId"`
			Expr       string
			Datasource struct{ Type, UID string }
		}
	} `json:"panels"`
}

func TestDashboardsAreImportable(t *testing.T) {
	files, err := fs.Glob(metrics.Dashboards(), "*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	uids := map[string]bool{}
	for _, f := range files {
		data, err := fs.ReadFile(metrics.Dashboards(), f)
		if err != nil {
			t.Fatal(err)
		}
		var d importable
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.ID != nil || d.UID == "" || uids[d.UID] || d.Title == "" || d.Schema < 36 {
			t.Errorf("%s: id %v, uid %q (seen %v), title %q, schema %d: want id null, a unique uid, a title, schema 36+",
				f, d.ID, d.UID, uids[d.UID], d.Title, d.Schema)
		}
		uids[d.UID] = true
		if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
			return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
		}) {
			t.Errorf("%s: no datasource variable of type prometheus", f)
		}
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", f, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.X < 0 || p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
				t.Errorf("%s %q: grid position %+v outside the 24 columns", f, p.Title, p.GridPos)
			}
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
				t.Errorf("%s %q: data source %+v, want the ${datasource} variable", f, p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s %q: no query", f, p.Title)
			}
			refs := map[string]bool{}
			for _, q := range p.Targets {
				if q.Datasource.UID != "${datasource}" || q.RefID == "" || refs[q.RefID] {
					t.Errorf("%s %q: query %q: data source %+v, refId %q", f, p.Title, q.Expr, q.Datasource, q.RefID)
				}
				refs[q.RefID] = true
			}
		}
	}
	// Every file under dashboards/ is embedded.
	entries, err := os.ReadDir("dashboards")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if path.Ext(e.Name()) == ".json" && !slices.Contains(files, e.Name()) {
			t.Errorf("dashboards/%s is not embedded", e.Name())
		}
	}
}

func TestProvisioningFiles(t *testing.T) {
	var dash struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Name    string
			Type    string
			Options struct{ Path string }
		}
	}
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct{ Name, Type, URL, Access string }
	}
	for file, v := range map[string]any{"provisioning/dashboards.yaml": &dash, "provisioning/datasource.yaml": &ds} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if dash.APIVersion != 1 || len(dash.Providers) != 1 || dash.Providers[0].Type != "file" || dash.Providers[0].Options.Path == "" {
		t.Errorf("dashboards.yaml: %+v", dash)
	}
	if ds.APIVersion != 1 || len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://127.0.0.1:9090" {
		t.Errorf("datasource.yaml: %+v", ds)
	}
}
