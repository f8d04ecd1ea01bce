package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

func TestGenerateJSON(t *testing.T) {
	path, err := fixtures.Bundle(fixtures.DefaultCacheDir(), fixtures.GPT2Tiny)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) generateOutput {
		t.Helper()
		var out, errb bytes.Buffer
		if rc := generateMain(append([]string{"--bundle", path, "--json"}, args...), &out, &errb); rc != 0 {
			t.Fatalf("qual generate %v: exit %d: %s", args, rc, errb.String())
		}
		var g generateOutput
		if err := json.Unmarshal(out.Bytes(), &g); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out.String())
		}
		return g
	}
	g := run("--prompt", "Hello, world", "--max-tokens", "6", "--ignore-eos")
	// "Hello, world" is [15496, 11, 995] in GPT-2's vocabulary.
	if len(g.PromptIDs) != 3 || g.PromptIDs[0] != 15496 || g.PromptIDs[1] != 11 || g.PromptIDs[2] != 995 {
		t.Fatalf("prompt ids %v, want [15496 11 995]", g.PromptIDs)
	}
	if len(g.IDs) != 6 || len(g.TopLogprobs) != 6 || g.FinishReason != "length" || g.Text == "" {
		t.Fatalf("got %d ids, %d top_logprobs, finish %q, text %q; want 6, 6, length, non-empty", len(g.IDs), len(g.TopLogprobs), g.FinishReason, g.Text)
	}
	for i, tl := range g.TopLogprobs {
		if len(tl) != 5 || tl[0].ID != g.IDs[i] {
			t.Fatalf("step %d: top_logprobs %v; want 5 entries led by the greedy token %d", i, tl, g.IDs[i])
		}
		for j := 1; j < 5; j++ {
			if tl[j].Logprob > tl[j-1].Logprob || tl[j-1].Logprob > 0 {
				t.Fatalf("step %d: logprobs %v are not descending and <= 0", i, tl)
			}
		}
	}
	if g2 := run("--prompt-ids", "15496, 11,995", "--max-tokens", "6", "--ignore-eos"); !equalInt32(g2.IDs, g.IDs) || g2.Text != g.Text {
		t.Fatalf("--prompt-ids gave %v %q, --prompt gave %v %q", g2.IDs, g2.Text, g.IDs, g.Text)
	}
	a := run("--prompt-ids", "1,2,3", "--max-tokens", "8", "--temperature", "1", "--seed", "5", "--ignore-eos")
	b := run("--prompt-ids", "1,2,3", "--max-tokens", "8", "--temperature", "1", "--seed", "5", "--ignore-eos")
	if !equalInt32(a.IDs, b.IDs) {
		t.Fatalf("same seed gave %v and %v", a.IDs, b.IDs)
	}

	var out, errb bytes.Buffer
	if rc := generateMain([]string{"--bundle", path, "--prompt-ids", "1,x"}, &out, &errb); rc == 0 || !strings.Contains(errb.String(), "--prompt-ids") {
		t.Fatalf("bad --prompt-ids: exit %d, stderr %q; want an error naming --prompt-ids", rc, errb.String())
	}
	errb.Reset()
	if rc := generateMain([]string{"--bundle", path, "--prompt-ids", "1", "--max-tokens", "5000"}, &out, &errb); rc == 0 || !strings.Contains(errb.String(), "max_context") {
		t.Fatalf("over-long request: exit %d, stderr %q; want an error naming max_context", rc, errb.String())
	}
}

func equalInt32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
