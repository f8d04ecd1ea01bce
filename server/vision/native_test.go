package vision

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
)

// logitTolerance is the native-vs-transformers bound on |Δlogit| for fp32 on both sides (the
// text families' bound).
const logitTolerance = 1e-3

func openTiny(t *testing.T) *native.Engine { return openFixture(t, fixtures.Qwen3VLTiny, 512) }

// openFixture opens a fixture's bundle on the CPU engine (2 threads, batch 2).
func openFixture(t *testing.T, name string, maxContext int) *native.Engine {
	t.Helper()
	path, err := fixtures.Bundle("", name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	e, err := native.Open(b, native.Params{Threads: 2, MaxBatch: 2, MaxContext: maxContext})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// pixelsFor returns the processor's pixel values for a golden entry, decoded by Decode (whose
// pixels TestProcessorParity holds equal to Pillow's, JPEG included).
func pixelsFor(t *testing.T, root string, cfg *Config, name, image, rgbSHA string) (*Result, string) {
	data, err := os.ReadFile(filepath.Join(root, image))
	if err != nil {
		t.Fatal(err)
	}
	im, err := Decode(data, mimeOf(image), 1<<26)
	if err != nil {
		t.Fatal(err)
	}
	if im.PixelsSHA256 != rgbSHA {
		t.Fatalf("%s: decoded pixels differ from Pillow's (see TestProcessorParity)", name)
	}
	r, err := cfg.Preprocess(im.RGB, im.Width, im.Height)
	if err != nil {
		t.Fatal(err)
	}
	return r, im.Format
}

// TestNativeCorpusParity runs the native qwen3vl engine (CPU, fp32) on the 10-image corpus and
// compares it with transformers 5.17: 32 greedy tokens per image and the top-5 logits of every
// step (from the golden continuation) within logitTolerance. It prints the corpus table.
func TestNativeCorpusParity(t *testing.T) {
	root, g, cfg := loadGolden(t)
	e := openTiny(t)
	rows := []string{fmt.Sprintf("%-18s %-9s %-7s %-6s %-5s %-10s %s", "image", "size", "resized", "tokens", "match", "max|diff|", "format")}
	pass := 0
	for _, ge := range g.Entries {
		r, src := pixelsFor(t, root, cfg, ge.Name, ge.Image, ge.RGBSHA256)
		im := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
		got, match, worst := greedyParity(t, e, ge.PromptIDs, im, ge.GreedyIDs, func(s int) ([]int32, []float64) {
			return ge.Steps[s].Top5IDs, ge.Steps[s].Top5Logits
		})
		ok := match && worst <= logitTolerance
		if ok {
			pass++
		} else {
			t.Errorf("%s: greedy match %v, max |Δlogit| %.3g (tolerance %g)\nnative:       %v\ntransformers: %v", ge.Name, match, worst, logitTolerance, got, ge.GreedyIDs)
		}
		rows = append(rows, fmt.Sprintf("%-18s %-9s %-7s %-6d %-5v %-10.3g %s", ge.Name, fmt.Sprintf("%dx%d", ge.Width, ge.Height),
			fmt.Sprintf("%dx%d", r.ResizedWidth, r.ResizedHeight), r.Tokens, match, worst, src))
	}
	t.Logf("qwen3vl-tiny corpus parity (native CPU fp32 vs transformers 5.17): %d/%d\n%s", pass, len(g.Entries), strings.Join(rows, "\n"))
}

// greedyParity generates len(greedy) tokens from prompt with the image (EOS ignored) and reads
// the logits of the golden continuation: whether the tokens equal greedy, and the largest
// |Δlogit| over each step's golden top-5 (top5(s) gives step s's ids and logits).
func greedyParity(t *testing.T, e *native.Engine, prompt []int32, im *native.Image, greedy []int32, top5 func(s int) ([]int32, []float64)) ([]int32, bool, float64) {
	t.Helper()
	steps := len(greedy)
	id, err := e.AddImage(prompt, im, native.Sampling{MaxNewTokens: steps, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			if ev.Seq == id && ev.Token >= 0 {
				got = append(got, ev.Token)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	match := len(got) == steps
	for i := 0; match && i < steps; i++ {
		match = got[i] == greedy[i]
	}
	all := append(append([]int32{}, prompt...), greedy[:steps-1]...)
	lg, err := e.LogitsImage(all, im)
	if err != nil {
		t.Fatal(err)
	}
	V := e.Info().VocabSize
	worst := 0.0
	for s := 0; s < steps; s++ {
		pos := len(prompt) - 1 + s
		ids, logits := top5(s)
		for j, tok := range ids {
			worst = math.Max(worst, math.Abs(float64(lg[pos*V+int(tok)])-logits[j]))
		}
	}
	return got, match, worst
}

// TestNativeImageSensitivity: another image changes the logits (a model that ignored the image
// would pass greedy parity on images whose tokens do not move the argmax, but not this).
func TestNativeImageSensitivity(t *testing.T) {
	root, g, cfg := loadGolden(t)
	e := openTiny(t)
	a, _ := pixelsFor(t, root, cfg, g.Entries[2].Name, g.Entries[2].Image, g.Entries[2].RGBSHA256) // small-40x40: 4 tokens
	b, _ := pixelsFor(t, root, cfg, g.Entries[5].Name, g.Entries[5].Image, g.Entries[5].RGBSHA256) // pixel-1x1: 4 tokens
	ids := g.Entries[2].PromptIDs
	la, err := e.LogitsImage(ids, &native.Image{Pixels: a.Pixels, Grid: a.Grid})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.LogitsImage(ids, &native.Image{Pixels: b.Pixels, Grid: b.Grid})
	if err != nil {
		t.Fatal(err)
	}
	V := e.Info().VocabSize
	last := (len(ids) - 1) * V
	d := 0.0
	for i := 0; i < V; i++ {
		d = math.Max(d, math.Abs(float64(la[last+i]-lb[last+i])))
	}
	if d < 10*logitTolerance {
		t.Fatalf("two different images give last-position logits within %.3g; the image does not reach the model", d)
	}
	t.Logf("max |Δlogit| between two images: %.3g", d)
}

// TestNativeImageRefusals: the engine refuses a prompt whose placeholders disagree with the
// image, and the next valid request still works.
func TestNativeImageRefusals(t *testing.T) {
	root, g, cfg := loadGolden(t)
	e := openTiny(t)
	ge := g.Entries[2]
	r, _ := pixelsFor(t, root, cfg, ge.Name, ge.Image, ge.RGBSHA256)
	im := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
	short := append([]int32{}, ge.PromptIDs[:5]...) // one placeholder of four
	short = append(short, ge.PromptIDs[8:]...)
	if _, err := e.AddImage(short, im, native.Sampling{MaxNewTokens: 1}); err == nil || !strings.Contains(err.Error(), "image tokens") {
		t.Fatalf("a prompt with 1 of 4 image tokens: %v", err)
	}
	if _, err := e.AddImage(ge.PromptIDs, &native.Image{Pixels: r.Pixels[:10], Grid: r.Grid}, native.Sampling{MaxNewTokens: 1}); err == nil || !strings.Contains(err.Error(), "pixel values") {
		t.Fatalf("truncated pixels: %v", err)
	}
	start := time.Now()
	id, err := e.AddImage(ge.PromptIDs, im, native.Sampling{MaxNewTokens: 4, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for e.Active() > 0 {
		if _, err := e.Step(func(ev native.Event) {
			if ev.Seq == id && ev.Token >= 0 {
				n++
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n != 4 {
		t.Fatalf("valid request after refusals produced %d tokens", n)
	}
	t.Logf("valid request after refusals: 4 tokens in %v", time.Since(start))
}

// TestNativeFaultsBreakParity proves the corpus gate bites: each planted qwen3vl defect moves
// the first-step logits of the first image past the tolerance.
func TestNativeFaultsBreakParity(t *testing.T) {
	root, g, cfg := loadGolden(t)
	ge := g.Entries[2]
	r, _ := pixelsFor(t, root, cfg, ge.Name, ge.Image, ge.RGBSHA256)
	for _, f := range []string{"qwen3vl.drop_deepstack", "qwen3vl.flat_rope", "qwen3vl.drop_q_norm", "qwen3vl.rope_theta_x10"} {
		t.Run(f, func(t *testing.T) {
			t.Setenv("MODELQUAL_FAULTS", f)
			e := openTiny(t)
			lg, err := e.LogitsImage(ge.PromptIDs, &native.Image{Pixels: r.Pixels, Grid: r.Grid})
			if err != nil {
				t.Fatal(err)
			}
			V := e.Info().VocabSize
			last := (len(ge.PromptIDs) - 1) * V
			worst := 0.0
			for j, id := range ge.FirstTop20IDs {
				worst = math.Max(worst, math.Abs(float64(lg[last+int(id)])-ge.FirstTop20Logits[j]))
			}
			if worst <= logitTolerance {
				t.Fatalf("with %s the first-step logits still match transformers (max |Δ| %.3g)", f, worst)
			}
			t.Logf("%s: max |Δlogit| %.3g", f, worst)
		})
	}
}
