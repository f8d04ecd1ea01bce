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
