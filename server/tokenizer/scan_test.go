package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// scanAlphabet mixes every character class the patterns distinguish: ASCII letters (both cases,
// for the case-insensitive contractions), digits, apostrophes, punctuation, all kinds of
// whitespace (including CR/LF and non-ASCII spaces), non-ASCII letters and digits, marks,
// emoji and symbols.
var scanAlphabet = []string{
	"a", "b", "s", "t", "ſ", "S", "T", "r", "e", "v", "m", "l", "L", "d", "D", "x",
	"0", "7", "'", "'", "\"", ".", ",", "!", "-", "_", "(", ")", "#",
	" ", " ", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u0085",
	"é", "ß", "中", "文", "한", "٣", "Ⅻ", "²", "\u0301", "😀", "👩\u200d💻", "©", "∑",
}

func randomText(r *rand.Rand, n int) string {
	var sb strings.Builder
	for range n {
		sb.WriteString(scanAlphabet[r.IntN(len(scanAlphabet))])
	}
	return sb.String()
}

func collect(f finder, s string) [][2]int {
	var out [][2]int
	f.findAll(s, func(a, b int) { out = append(out, [2]int{a, b}) })
	return out
}

// TestScannersMatchRegexp2 checks each hand-written scanner against regexp2 running the same
// pattern on random text: the scanners exist only for speed and must not change a split.
func TestScannersMatchRegexp2(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		pattern string
		scanner finder
	}{
		{gpt2Pattern, gpt2Scanner{}},
		{qwen2Pattern, qwenScanner{maxDigits: 1}},
		{llama3Pattern, qwenScanner{maxDigits: 3}},
	} {
		ref, err := compileRegexFinder(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3000; i++ {
			s := randomText(r, 1+r.IntN(40))
			if got, want := collect(tc.scanner, s), collect(ref, s); !slices.Equal(got, want) {
				t.Fatalf("pattern %q on %q:\n scanner %v\n regexp2 %v", tc.pattern, s, got, want)
			}
		}
	}
}

// FuzzScanners is the fuzzing form of TestScannersMatchRegexp2.
func FuzzScanners(f *testing.F) {
	for _, s := range []string{"Hello world", "It's 'S 'll", "a  b\n\n c", "x\r\n\r\n  y", "(hi) 123 4567", "\u3000\u3000a"} {
		f.Add(s)
	}
	gpt2Ref, _ := compileRegexFinder(gpt2Pattern)
	qwenRef, _ := compileRegexFinder(qwen2Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			t.Skip() // regexp2 decodes invalid bytes differently; Encode repairs them first
		}
		if got, want := collect(gpt2Scanner{}, s), collect(gpt2Ref, s); !slices.Equal(got, want) {
			t.Fatalf("gpt2 on %q: scanner %v, regexp2 %v", s, got, want)
		}
		if got, want := collect(qwenScanner{maxDigits: 1}, s), collect(qwenRef, s); !slices.Equal(got, want) {
			t.Fatalf("qwen on %q: scanner %v, regexp2 %v", s, got, want)
		}
	})
}

// TestMergeHeapMatchesSmall checks that the two merge loops (array scan for short words,
// tokenizers' heap algorithm for long ones) produce the same tokens.
func TestMergeHeapMatchesSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, name := range []string{"gpt2", "qwen3"} {
		m := fixtureTokenizer(t, name).model.(*bpeModel)
		for i := 0; i < 2000; i++ {
			s := randomText(r, 1+r.IntN(40))
			var syms []int32
			for j := 0; j < len(s) && len(syms) < 128; j++ {
				syms = append(syms, m.byteIDs[s[j]])
			}
			small := m.mergeSmall(slices.Clone(syms))
			heap := m.mergeHeap(slices.Clone(syms))
			if !slices.Equal(small, heap) {
				t.Fatalf("%s %q: mergeSmall %v, mergeHeap %v", name, s, small, heap)
			}
		}
	}
}
