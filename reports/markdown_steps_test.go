package reports

import (
	"math"
	"strings"
	"testing"
)

// summary.md shows the server's engine steps per kind (mean length, tokens per step, share of
// the engine's time), and merging shards sums them.
func TestEngineStepsInMarkdownAndMerge(t *testing.T) {
	es := &EngineSteps{
		Prefill: StepStats{Steps: 4, Seconds: 0.060, Tokens: 8000},
		Decode:  StepStats{Steps: 100, Seconds: 0.140, Tokens: 3100},
	}
	md := Markdown(&Summary{Run: Run{Name: "steps", EngineSteps: es}})
	for _, want := range []string{
		"| Engine steps | Steps | Mean (ms) | Tokens per step | Share of engine time (%) |",
		"| prefill | 4 | 15.00 | 2000.00 | 30.00 |",
		"| decode | 100 | 1.40 | 31.00 | 70.00 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}
	if md := Markdown(&Summary{Run: Run{Name: "none"}}); strings.Contains(md, "Engine steps") {
		t.Errorf("summary.md shows engine steps for a run without them:\n%s", md)
	}

	other := &EngineSteps{Prefill: StepStats{Steps: 1, Seconds: 0.01, Tokens: 100}}
	m, err := Merge([]*Run{{Name: "a", EngineSteps: es}, {Name: "b"}, {Name: "c", EngineSteps: other}}, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.EngineSteps; got == nil || got.Prefill.Steps != 5 || math.Abs(got.Prefill.Seconds-0.07) > 1e-12 ||
		got.Prefill.Tokens != 8100 || got.Decode != es.Decode {
		t.Errorf("merged engine steps %+v", got)
	}
}

// Since is what the engine did between two readings of its totals; a total that went down
// (a restarted server) is an error, not a negative figure in the report.
func TestEngineStepsSince(t *testing.T) {
	before := EngineSteps{Prefill: StepStats{Steps: 2, Seconds: 0.5, Tokens: 300}, Decode: StepStats{Steps: 10, Seconds: 1, Tokens: 40}}
	after := EngineSteps{Prefill: StepStats{Steps: 5, Seconds: 0.75, Tokens: 900}, Decode: StepStats{Steps: 30, Seconds: 3, Tokens: 120}}
	d, err := after.Since(before)
	if err != nil || d.Prefill != (StepStats{Steps: 3, Seconds: 0.25, Tokens: 600}) || d.Decode != (StepStats{Steps: 20, Seconds: 2, Tokens: 80}) {
		t.Fatalf("since %+v %v", d, err)
	}
	if _, err := before.Since(after); err == nil || !strings.Contains(err.Error(), "went down") {
		t.Fatalf("totals that went down: %v, want an error", err)
	}
}
