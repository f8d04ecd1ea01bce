package reference

import (
	"testing"

	"github.com/modelqual/modelqual/families/internal/golden"
	"github.com/modelqual/modelqual/fixtures"
)

// TestAgainstTransformers compares this reference with GPT2LMHeadModel's outputs on the
// gpt2-tiny fixture (fixtures/golden/gpt2-tiny.json): identical greedy tokens for every
// corpus prompt and top-5 logits within 1e-3 at every step.
func TestAgainstTransformers(t *testing.T) {
	dir, rev, err := fixtures.Ensure("", fixtures.GPT2Tiny)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := golden.CheckFixture(m, fixtures.GPT2Tiny, rev); err != nil {
		t.Fatal(err)
	}
}
