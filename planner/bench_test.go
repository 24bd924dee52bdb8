package planner

import (
	"io"
	"testing"
)

// benchCatalogue: 10,000 modules in 10 layers (one repository each), each
// built on up to 3 modules of earlier layers.
var benchModules = layered(10000, 10, 3, 1)

func BenchmarkNewIndex10000(b *testing.B) {
	c := catalogue(benchModules...)
	b.ReportAllocs()
	for b.Loop() {
		NewIndex(c)
	}
}

func BenchmarkPlan10000(b *testing.B) {
	c := catalogue(benchModules...)
	ix := NewIndex(c)
	cases := []struct {
		name string
		t    Trigger
	}{
		// A push to the bottom layer's repository: every module is planned.
		{"push-everything", push(repoOf(0))},
		// One changed path in the bottom layer: one module and what is built on it.
		{"push-one-path", push(repoOf(0), "m00007/Dockerfile")},
		// A rebuild of one module in the middle.
		{"rebuild-middle", rebuild("m05000")},
		// A push matching nothing.
		{"push-nothing", push("https://git.example/none.git")},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			p, err := ix.Plan(tc.t)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(p.Modules)), "modules")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ix.Plan(tc.t); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("new-push-everything", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(c, push(repoOf(0))); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkExplain10000(b *testing.B) {
	p, err := New(catalogue(benchModules...), push(repoOf(0)))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := p.Explain(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
