package vision

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
)

// The internvl family's engine and processor tests: the native InternVL (CPU, fp32) and the
// GOT-OCR2 processor against transformers 5.17's golden (fixtures/golden/internvl-tiny.json,
// made on the GPU host by fixtures/golden/make_internvl_golden.py), plus the checks that need
// no golden (the image reaches the model, refusals, planted defects move the logits).

// internVLGolden is the part of the golden these tests read.
type internVLGolden struct {
	Revision string `json:"revision"`
	Entries  []struct {
		fixtures.VisionEntry
		TileGrid          []int    `json:"tile_grid"`
		Tiles             int      `json:"tiles"`
		PixelValuesSHA256 string   `json:"pixel_values_sha256"`
		TileSHA256        []string `json:"tile_sha256"`
		PixelSum          float64  `json:"pixel_sum"`
		PixelAbsSum       float64  `json:"pixel_abs_sum"`
		ResizedRGBSHA256  string   `json:"resized_rgb_sha256"`
		ThumbRGBSHA256    string   `json:"thumb_rgb_sha256"`
		TileU8SHA256      []string `json:"tile_u8_sha256"`
	} `json:"entries"`
	// Pairs are the two-image requests (families/internvl/corpus-pairs.jsonl).
	Pairs []struct {
		Name             string                `json:"name"`
		Images           []string              `json:"images"`
		PromptIDs        []int32               `json:"prompt_ids"`
		ImageTokens      int                   `json:"image_tokens"`
		GreedyIDs        []int32               `json:"greedy_ids"`
		Steps            []fixtures.GoldenStep `json:"steps"`
		FirstTop20IDs    []int32               `json:"first_top20_ids"`
		FirstTop20Logits []float64             `json:"first_top20_logits"`
		Error            string                `json:"error"`
	} `json:"pairs"`
}

// loadInternVLGolden reads the golden, skipping (loudly, naming the script) when the GPU-host
// run has not made it yet; the family suite (families/internvl) fails instead.
func loadInternVLGolden(t *testing.T) (string, *internVLGolden) {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "fixtures", "golden", "internvl-tiny.json"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("NO GOLDEN: fixtures/golden/internvl-tiny.json is missing; make it with fixtures/golden/run_internvl_golden.sh on a host with transformers 5.17 (fixtures/PROVENANCE.md)")
	}
	if err != nil {
		t.Fatal(err)
	}
	var g internVLGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Entries) < 12 {
		t.Fatalf("golden has %d entries, want the corpus of at least 12", len(g.Entries))
	}
	return root, &g
}

// internVLProcessor is the fixture's processor, configured from its config.json as the server
// does.
func internVLProcessor(t testing.TB) *GotOcr2Config {
	t.Helper()
	snap, _, err := fixtures.Ensure("", fixtures.InternVLTiny)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := os.ReadFile(filepath.Join(snap, "preprocessor_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProcessor(pc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(snap, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	c := p.(*GotOcr2Config)
	if err := c.UseModelConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

func openInternVL(t *testing.T) *native.Engine { return openFixture(t, fixtures.InternVLTiny, 4096) }

func internVLImage(t testing.TB, c *GotOcr2Config, path string) (*Result, *Image) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	im, err := Decode(data, mimeOf(path), 1<<26)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Preprocess(im.RGB, im.Width, im.Height)
	if err != nil {
		t.Fatal(err)
	}
	return r, im
}

// internVLPrompt lays out a chat prompt as InternVLProcessor does: text ids around <img>,
// tokens x <IMG_CONTEXT>, </img> (151669, 151671, 151670 in the fixture's tokenizer).
func internVLPrompt(tokens int) []int32 {
	ids := []int32{151644, 872, 198, 151669}
	for i := 0; i < tokens; i++ {
		ids = append(ids, 151671)
	}
	return append(ids, 151670, 198, 74785, 419, 2168, 13, 151645, 198, 151644, 77091, 198)
}

func lastLogits(t *testing.T, e *native.Engine, ids []int32, r *Result) []float32 {
	t.Helper()
	lg, err := e.LogitsImage(ids, &native.Image{Pixels: r.Pixels, Grid: r.Grid})
	if err != nil {
		t.Fatal(err)
	}
	V := e.Info().VocabSize
	return lg[(len(ids)-1)*V : len(ids)*V]
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// TestInternVLNativeImageReachesModel: two images with the same tile count give different
// logits, the same image twice gives the same, and every logit is finite (no golden needed).
func TestInternVLNativeImageReachesModel(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := internVLProcessor(t)
	a, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/09-gray-300x300.png"))
	b, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/12-pixel-1x1.png"))
	if a.Grid[0] != 1 || b.Grid[0] != 1 {
		t.Fatalf("tiles %d and %d, want one each", a.Grid[0], b.Grid[0])
	}
	e := openInternVL(t)
	ids := internVLPrompt(a.Tokens)
	start := time.Now()
	la := lastLogits(t, e, ids, a)
	took := time.Since(start)
	lb := lastLogits(t, e, ids, b)
	la2 := lastLogits(t, e, ids, a)
	for _, v := range la {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatal("non-finite logit")
		}
	}
	if d := maxDiff(la, la2); d != 0 {
		t.Errorf("the same image twice: logits differ by %.3g", d)
	}
	if d := maxDiff(la, lb); d < 1e-2 {
		t.Fatalf("two different images give last-position logits within %.3g; the image does not reach the model", d)
	} else {
		t.Logf("max |Δlogit| between two images: %.3g; one-tile prompt of %d ids in %v", d, len(ids), took)
	}
}

// TestInternVLNativeRefusals: a prompt whose <IMG_CONTEXT> count disagrees with the tiles, a
// grid of the wrong side and truncated pixels are refused naming the reason.
func TestInternVLNativeRefusals(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := internVLProcessor(t)
	r, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	e := openInternVL(t)
	im := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
	for _, tc := range []struct {
		name string
		ids  []int32
		im   *native.Image
		want string
	}{
		{"one tile too few", internVLPrompt(r.Tokens - 64), im, "image tokens"},
		{"wrong grid side", internVLPrompt(r.Tokens), &native.Image{Pixels: r.Pixels, Grid: [3]int{r.Grid[0], r.Grid[1] / 2, r.Grid[2] / 2}}, "grid"},
		{"truncated pixels", internVLPrompt(r.Tokens), &native.Image{Pixels: r.Pixels[:100], Grid: r.Grid}, "pixel values"},
	} {
		if _, err := e.AddImage(tc.ids, tc.im, native.Sampling{MaxNewTokens: 1}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := e.LogitsImage(internVLPrompt(r.Tokens), im); err != nil {
		t.Fatalf("valid request after refusals: %v", err)
	}
}

// TestInternVLProcessorParity holds the processor to transformers on every corpus image: the
// decoded RGB (Pillow's), the tile grid and count, the 8-bit tiled canvas and thumbnail
// recovered from pixel_values exactly, and pixel_values' sums within 1e-5 per value.
func TestInternVLProcessorParity(t *testing.T) {
	root, g := loadInternVLGolden(t)
	c := internVLProcessor(t)
	var rows []string
	for _, ge := range g.Entries {
		r, im := internVLImage(t, c, filepath.Join(root, ge.Image))
		var problems []string
		if im.PixelsSHA256 != ge.RGBSHA256 {
			problems = append(problems, "decoded RGB differs from Pillow's")
		}
		if len(ge.TileGrid) == 2 && (r.ResizedWidth != ge.TileGrid[0]*448 || r.ResizedHeight != ge.TileGrid[1]*448) {
			problems = append(problems, fmt.Sprintf("grid %dx%d tiles, transformers %v", r.ResizedWidth/448, r.ResizedHeight/448, ge.TileGrid))
		}
		if r.Grid[0] != ge.Tiles || r.Tokens != ge.ImageTokens {
			problems = append(problems, fmt.Sprintf("%d tiles %d tokens, transformers %d and %d", r.Grid[0], r.Tokens, ge.Tiles, ge.ImageTokens))
		}
		if got := sha256Hex(r.Resized); got != ge.ResizedRGBSHA256 {
			var bad []string
			for i, want := range ge.TileU8SHA256 {
				if i < r.Grid[0] && sha256Hex(tileU8(c, r, i)) != want {
					bad = append(bad, fmt.Sprint(i))
				}
			}
			d := "tiles differing: [" + strings.Join(bad, " ") + "]"
			if want := readPNG(t, filepath.Join(root, "fixtures", "golden", "internvl-tiny", ge.Name+".resized.png")); want != nil {
				d += fmt.Sprintf(", %d of %d bytes", countDiff(want, r.Resized), len(want))
			}
			problems = append(problems, "8-bit tiled canvas differs; "+d)
		}
		if ge.ThumbRGBSHA256 != "" && sha256Hex(tileU8(c, r, r.Grid[0]-1)) != ge.ThumbRGBSHA256 {
			problems = append(problems, "8-bit thumbnail differs")
		}
		var sum, abs float64
		for _, v := range r.Pixels {
			sum += float64(v)
			abs += math.Abs(float64(v))
		}
		if n := float64(len(r.Pixels)); math.Abs(sum-ge.PixelSum) > 1e-5*n || math.Abs(abs-ge.PixelAbsSum) > 1e-5*n {
			problems = append(problems, fmt.Sprintf("pixel sums %.6g/%.6g, transformers %.6g/%.6g", sum, abs, ge.PixelSum, ge.PixelAbsSum))
		}
		if len(problems) > 0 {
			t.Errorf("%s: %s", ge.Name, strings.Join(problems, "; "))
		}
		rows = append(rows, fmt.Sprintf("%-26s %-9s grid %dx%d tiles %d tokens %d ok=%v", ge.Name, fmt.Sprintf("%dx%d", ge.Width, ge.Height),
			r.ResizedWidth/448, r.ResizedHeight/448, r.Grid[0], r.Tokens, len(problems) == 0))
	}
	t.Logf("internvl processor parity:\n%s", strings.Join(rows, "\n"))
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// tileU8 recovers tile i's 8-bit pixels (row-major RGB; the last tile is the thumbnail when
// there is one) from its values as the golden script recovers transformers'
// (round(v * std * 255 + mean * 255)).
func tileU8(c *GotOcr2Config, r *Result, i int) []uint8 {
	t := 448
	px := r.Pixels[i*3*t*t:]
	out := make([]uint8, t*t*3)
	for ch := 0; ch < 3; ch++ {
		for i := 0; i < t*t; i++ {
			v := math.Round(float64(px[ch*t*t+i])*c.ImageStd[ch]*255 + c.ImageMean[ch]*255)
			out[3*i+ch] = uint8(math.Max(0, math.Min(255, v)))
		}
	}
	return out
}

func countDiff(a, b []uint8) int {
	if len(a) != len(b) {
		return max(len(a), len(b))
	}
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// TestInternVLNativeCorpusParity runs the native engine on the corpus with transformers' prompt
// ids: 32 greedy tokens and the top-5 logits of every step within logitTolerance.
func TestInternVLNativeCorpusParity(t *testing.T) {
	root, g := loadInternVLGolden(t)
	c := internVLProcessor(t)
	e := openInternVL(t)
	pass := 0
	var rows []string
	for _, ge := range g.Entries {
		r, _ := internVLImage(t, c, filepath.Join(root, ge.Image))
		im := &native.Image{Pixels: r.Pixels, Grid: r.Grid}
		got, match, worst := greedyParity(t, e, ge.PromptIDs, im, ge.GreedyIDs, func(s int) ([]int32, []float64) {
			return ge.Steps[s].Top5IDs, ge.Steps[s].Top5Logits
		})
		if match && worst <= logitTolerance {
			pass++
		} else {
			t.Errorf("%s: greedy match %v, max |Δlogit| %.3g\nnative:       %v\ntransformers: %v", ge.Name, match, worst, got, ge.GreedyIDs)
		}
		rows = append(rows, fmt.Sprintf("%-26s tiles %d tokens %-5d match %-5v max|Δ| %.3g", ge.Name, r.Grid[0], r.Tokens, match, worst))
	}
	t.Logf("internvl-tiny corpus parity (native CPU fp32 vs transformers): %d/%d\n%s", pass, len(g.Entries), strings.Join(rows, "\n"))
}

// TestInternVLNativeFaultsMoveLogits proves the parity gates bite: each planted internvl defect
// moves the last-position logits of a three-tile image past the tolerance (no golden needed:
// compared with the unfaulted engine).
func TestInternVLNativeFaultsMoveLogits(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := internVLProcessor(t)
	r, _ := internVLImage(t, c, filepath.Join(root, "fixtures/images/internvl/14-photo-800x400.jpg"))
	ids := internVLPrompt(r.Tokens)
	base := lastLogits(t, openInternVL(t), ids, r)
	for _, f := range []string{"internvl.shuffle_transposed", "internvl.drop_layer_scale", "internvl.drop_q_norm", "internvl.rope_theta_x10"} {
		t.Run(f, func(t *testing.T) {
			t.Setenv("MODELQUAL_FAULTS", f)
			d := maxDiff(base, lastLogits(t, openInternVL(t), ids, r))
			if d <= 10*logitTolerance {
				t.Fatalf("with %s the logits move by only %.3g", f, d)
			}
			t.Logf("%s: max |Δlogit| %.3g", f, d)
		})
	}
}

// TestInternVLNativePairsParity: two images in one prompt (their tiles stacked, as the server
// does under --max-images-per-request) against transformers' two-image requests: image tokens,
// 32 greedy tokens and every step's top-5 logits.
func TestInternVLNativePairsParity(t *testing.T) {
	root, g := loadInternVLGolden(t)
	if len(g.Pairs) == 0 {
		t.Fatal("the golden has no two-image requests (make_internvl_golden.py --pairs)")
	}
	c := internVLProcessor(t)
	e := openInternVL(t)
	for _, gp := range g.Pairs {
		if gp.Error != "" {
			t.Errorf("%s: transformers failed: %s", gp.Name, gp.Error)
			continue
		}
		im := &native.Image{}
		tokens := 0
		for _, path := range gp.Images {
			r, _ := internVLImage(t, c, filepath.Join(root, path))
			if im.Grid[0] == 0 {
				im.Grid = r.Grid
			} else {
				im.Grid[0] += r.Grid[0]
			}
			im.Pixels = append(im.Pixels, r.Pixels...)
			tokens += r.Tokens
		}
		if tokens != gp.ImageTokens {
			t.Errorf("%s: %d image tokens, transformers %d", gp.Name, tokens, gp.ImageTokens)
			continue
		}
		got, match, worst := greedyParity(t, e, gp.PromptIDs, im, gp.GreedyIDs, func(s int) ([]int32, []float64) {
			return gp.Steps[s].Top5IDs, gp.Steps[s].Top5Logits
		})
		if !match || worst > logitTolerance {
			t.Errorf("%s: greedy match %v, max |Δlogit| %.3g\nnative:       %v\ntransformers: %v", gp.Name, match, worst, got, gp.GreedyIDs)
		}
		t.Logf("%s: %d image tokens, match %v, max |Δlogit| %.3g", gp.Name, tokens, match, worst)
	}
}
