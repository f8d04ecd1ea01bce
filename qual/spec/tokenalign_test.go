package spec

import (
	"strings"
	"testing"

	"github.com/modelqual/modelqual/qual/launch/launchtest"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// Qwen3's byte-level BPE splits "🦙" into three tokens (" \xf0\x9f", "\xa6", "\x99"), none of
// them valid UTF-8 alone: the case where engines report tokens differently.
func TestAlignTokensByBytesNotPosition(t *testing.T) {
	tok, err := tokenizer.Load(launchtest.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	ref := tok.Encode("a 🦙 中文 b")
	if len(ref) != 7 {
		t.Fatalf("qwen3 encodes the sample to %d tokens, the test expects 7 (a, three llama pieces, 中, 文, b)", len(ref))
	}
	entries := func(texts ...string) []TokenLogprob {
		var out []TokenLogprob
		for _, s := range texts {
			out = append(out, TokenLogprob{Token: s})
		}
		return out
	}
	for _, c := range []struct {
		name         string
		ref          []int32
		served       []TokenLogprob
		differsAt    int // -1: no difference
		reported     string
		pairs, merge int
	}{
		{"one entry per token, pieces as U+FFFD (vLLM, qual-server)", ref, entries("a", " \uFFFD", "\uFFFD", "\uFFFD", " 中", "文", " b"), -1, "", 7, 0},
		{"one U+FFFD per byte", ref, entries("a", " \uFFFD\uFFFD", "\uFFFD", "\uFFFD", " 中", "文", " b"), -1, "", 7, 0},
		{"byte pieces folded into one entry (llama.cpp)", ref, entries("a", " 🦙", " 中", "文", " b"), -1, "carries reference tokens 1..3", 5, 1},
		{"an incomplete character held back at the end", ref[:3], entries("a"), -1, "incomplete UTF-8 character, were held back", 1, 0},
		{"another token generated", ref, entries("a", " 🦙", " 中", "字", " b"), 5, "carries reference tokens 1..3", 3, 1},
		{"another piece inside a character", ref, entries("a", " 🦊", " 中", "文", " b"), 1, "", 1, 0},
		{"an answer cut short on complete text", ref, entries("a", " 🦙"), 4, "carries reference tokens 1..3", 2, 1},
		{"entries past the reference", ref[:1], entries("a", " 🦙"), 1, "", 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			al := alignTokens(tok, c.ref, c.served)
			switch {
			case c.differsAt < 0 && al.Differs != "":
				t.Errorf("Differs %q; want none", al.Differs)
			case c.differsAt >= 0 && (al.Differs == "" || al.At != c.differsAt):
				t.Errorf("Differs %q at %d; want a difference at reference token %d", al.Differs, al.At, c.differsAt)
			}
			if c.reported == "" && len(al.Reported) > 0 || c.reported != "" && !strings.Contains(strings.Join(al.Reported, "\n"), c.reported) {
				t.Errorf("Reported %q; want %q", al.Reported, c.reported)
			}
			merged := 0
			for _, p := range al.Pairs {
				if p.Merged() {
					merged++
				}
			}
			if len(al.Pairs) != c.pairs || merged != c.merge {
				t.Errorf("%d pairs (%d merged); want %d (%d merged): %+v", len(al.Pairs), merged, c.pairs, c.merge, al.Pairs)
			}
		})
	}
}

func TestHeldBackTail(t *testing.T) {
	for _, c := range []struct {
		served, want string
		ok           bool
	}{
		{"ab", "ab\uFFFD", true},
		{"ab", "ab\uFFFD\uFFFD", true},
		{"ab", "ab", false}, // equal texts need no excuse
		{"a", "ab\uFFFD", false},
		{"ab\uFFFD", "ab", false},
	} {
		if got := heldBackTail(c.served, c.want); got != c.ok {
			t.Errorf("heldBackTail(%q, %q) = %v; want %v", c.served, c.want, got, c.ok)
		}
	}
}
