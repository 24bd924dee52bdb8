package main

import (
	_ "embed"
	"fmt"
	"math"
	"strings"
	"text/template"
)

// docTemplate is BENCHMARKS.md: prose around the table, every figure in
// it a reference to the run's results ({{fig "Benchmark…" "metric"
// "%.3f"}}), so that the prose cannot say something the table does not.
//
//go:embed benchmarks.md.tmpl
var docTemplate string

// Render is the document of a run: docTemplate executed on it. A figure
// the template names that the run did not report is an error, not a blank
// — unless its benchmark failed in the run (Report.Failed, its row an
// ERROR in the table): then it reads "—" (NaN for arithmetic), so that one
// failed benchmark does not lose the document of the others.
func Render(rep *Report) (string, error) {
	tab, _ := table(rows, rep, false)
	failed := func(bench string) bool {
		for b := range rep.Failed {
			if bench == b || strings.HasPrefix(bench, b+"/") {
				return true
			}
		}
		return false
	}
	val := func(bench, metric string) (float64, error) {
		m, ok := rep.Results[bench]
		if !ok && failed(bench) {
			return math.NaN(), nil
		}
		if !ok {
			return 0, fmt.Errorf("no results for %s in the run", bench)
		}
		v, ok := m[metric]
		if !ok {
			return 0, fmt.Errorf("%s reported no %s", bench, metric)
		}
		return v, nil
	}
	funcs := template.FuncMap{
		// fig is a figure of the run, formatted.
		"fig": func(bench, metric, format string) (string, error) {
			v, err := val(bench, metric)
			if err != nil {
				return "", err
			}
			if math.IsNaN(v) {
				return "—", nil
			}
			return fmt.Sprintf(format, v), nil
		},
		// val is a figure of the run, for arithmetic.
		"val": val,
		// valOr is a figure of the run, or def for a run saved without it.
		"valOr": func(bench, metric string, def float64) float64 {
			if v, err := val(bench, metric); err == nil {
				return v
			}
			return def
		},
		"sub": func(a, b float64) float64 { return a - b },
		"mul": func(a, b float64) float64 { return a * b },
		"div": func(a, b float64) float64 { return a / b },
		// pct is a ÷ b in whole percent.
		"pct": func(a, b float64) string { return fmt.Sprintf("%.0f", 100*a/b) },
		// suite is the wall time of a benchmark's go test run.
		"suite": func(bench string) (string, error) {
			w, ok := rep.Suites[bench]
			if !ok {
				return "", fmt.Errorf("no wall time for %s in the run", bench)
			}
			return w, nil
		},
	}
	t, err := template.New("BENCHMARKS.md").Funcs(funcs).Option("missingkey=error").Parse(docTemplate)
	if err != nil {
		return "", fmt.Errorf("the document's template: %w", err)
	}
	var b strings.Builder
	data := struct {
		*Report
		Table    string
		Date     string
		HostLine string
	}{rep, strings.TrimRight(tab, "\n"), rep.Ended.Format("2006-01-02 15:04 UTC"), hostLine(rep.Host)}
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("rendering the document: %w", err)
	}
	return b.String(), nil
}
