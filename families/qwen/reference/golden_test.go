package reference

import (
	"testing"

	"github.com/modelqual/modelqual/families/internal/golden"
	"github.com/modelqual/modelqual/fixtures"
)

// TestAgainstTransformers compares this reference with Qwen3ForCausalLM's outputs on the
// qwen3-tiny fixture (fixtures/golden/qwen3-tiny.json): identical greedy tokens for every
// corpus prompt and top-5 logits within 1e-3 at every step.
func TestAgainstTransformers(t *testing.T) {
	dir, rev, err := fixtures.Ensure("", fixtures.Qwen3Tiny)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := golden.CheckFixture(m, fixtures.Qwen3Tiny, rev); err != nil {
		t.Fatal(err)
	}
}
