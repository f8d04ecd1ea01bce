package vision

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// golden is the part of fixtures/golden/qwen3vl-tiny.json (transformers 5.17's
// Qwen2VLImageProcessor, torchvision backend) the processor is held to.
type golden struct {
	Entries []struct {
		Name, Image, Mode string
		Width, Height     int
		RGBSHA256         string    `json:"rgb_sha256"`
		ResizedHeight     int       `json:"resized_height"`
		ResizedWidth      int       `json:"resized_width"`
		Grid              []int     `json:"grid_thw"`
		ImageTokens       int       `json:"image_tokens"`
		PixelValuesSHA256 string    `json:"pixel_values_sha256"`
		PixelSum          float64   `json:"pixel_sum"`
		PixelAbsSum       float64   `json:"pixel_abs_sum"`
		ResizedRGBSHA256  string    `json:"resized_rgb_sha256"`
		Error             string    `json:"error"`
		PixelValuesShape  []int     `json:"pixel_values_shape"`
		FirstTop20IDs     []int32   `json:"first_top20_ids"`
		FirstTop20Logits  []float64 `json:"first_top20_logits"`
		PromptIDs         []int32   `json:"prompt_ids"`
		GreedyIDs         []int32   `json:"greedy_ids"`
		Steps             []struct {
			Top5IDs    []int32   `json:"top5_ids"`
			Top5Logits []float64 `json:"top5_logits"`
		} `json:"steps"`
	}
}

func loadGolden(t testing.TB) (string, *golden, *Config) {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Entries) != 10 {
		t.Fatalf("golden has %d entries, want the 10-image corpus", len(g.Entries))
	}
	snap, _, err := fixtures.Ensure("", fixtures.Qwen3VLTiny)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := os.ReadFile(filepath.Join(snap, "preprocessor_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(pc)
	if err != nil {
		t.Fatal(err)
	}
	return root, &g, cfg
}

func mimeOf(path string) string {
	if strings.HasSuffix(path, ".png") {
		return "image/png"
	}
	return "image/jpeg"
}

func sum256(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func pixelBytes(p []float32) []byte {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// TestProcessorParity holds Decode + Preprocess to transformers on the 10-image corpus: the
// decoded pixels equal to Pillow's (rgb_sha256; JPEG through libjpeg-turbo's IDCT, upsampling
// and colour conversion), the resized grid and image token count exactly, pixel_values within
// 1e-5 (checked through the float32 bytes' sha256, which is stricter, and through transformers'
// resized 8-bit image where the golden run returned it).
func TestProcessorParity(t *testing.T) {
	root, g, cfg := loadGolden(t)
	var rows []string
	for _, e := range g.Entries {
		t.Run(e.Name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, e.Image))
			if err != nil {
				t.Fatal(err)
			}
			im, err := Decode(data, mimeOf(e.Image), 1<<26)
			if err != nil {
				t.Fatal(err)
			}
			if im.Width != e.Width || im.Height != e.Height {
				t.Fatalf("decoded %dx%d, golden %dx%d", im.Width, im.Height, e.Width, e.Height)
			}
			decodeSame := im.PixelsSHA256 == e.RGBSHA256
			r, err := cfg.Preprocess(im.RGB, im.Width, im.Height)
			if err != nil {
				t.Fatal(err)
			}
			if r.ResizedHeight != e.ResizedHeight || r.ResizedWidth != e.ResizedWidth || r.Grid[0] != e.Grid[0] || r.Grid[1] != e.Grid[1] || r.Grid[2] != e.Grid[2] {
				t.Errorf("resized %dx%d grid %v; transformers %dx%d grid %v", r.ResizedWidth, r.ResizedHeight, r.Grid, e.ResizedWidth, e.ResizedHeight, e.Grid)
			}
			if r.Tokens != e.ImageTokens {
				t.Errorf("%d image tokens; transformers %d", r.Tokens, e.ImageTokens)
			}
			if len(r.Pixels) != e.PixelValuesShape[0]*e.PixelValuesShape[1] {
				t.Fatalf("%d pixel values; transformers %v", len(r.Pixels), e.PixelValuesShape)
			}
			var s, as float64
			for _, v := range r.Pixels {
				s += float64(v)
				as += math.Abs(float64(v))
			}
			exact := sum256(pixelBytes(r.Pixels)) == e.PixelValuesSHA256
			if !decodeSame {
				// Decode is held to Pillow's pixels for every format, JPEG included (package
				// ljpeg + libjpegRGB reproduce libjpeg-turbo's decoding).
				d := -1
				if pil := readPNG(t, filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny", e.Name+".decoded.png")); pil != nil {
					d = 0
					for i := range pil {
						d = max(d, int(absDiff(pil[i], im.RGB[i])))
					}
				}
				t.Errorf("decoded pixels differ from Pillow's (rgb_sha256); max level difference %d (-1: Pillow's pixels not stored)", d)
			}
			maxDiff := -1.0 // unknown unless transformers' resized image came back
			if ref := readPNG(t, filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny", e.Name+".resized.png")); ref != nil {
				maxDiff = 0
				for i, v := range r.Resized {
					d := math.Abs(float64(v)-float64(ref[i])) / 127.5 // one 8-bit level in pixel_values
					maxDiff = math.Max(maxDiff, d)
				}
			}
			rows = append(rows, fmt.Sprintf("%-18s %-4s %4dx%-4d -> %4dx%-4d tokens %3d  decode==PIL %-5v pixel_values bit-exact %-5v max|diff| %.3g",
				e.Name, e.Mode, e.Width, e.Height, r.ResizedWidth, r.ResizedHeight, r.Tokens, decodeSame, exact, maxDiff))
			if !exact {
				t.Errorf("pixel_values differ from transformers' (sha256); sum %.6f vs %.6f, abs sum %.6f vs %.6f, decoded pixels equal PIL's: %v, max|diff| %.3g",
					s, e.PixelSum, as, e.PixelAbsSum, decodeSame, maxDiff)
			}
			if maxDiff > 1e-5 {
				t.Errorf("max|pixel diff| %.3g > 1e-5", maxDiff)
			}
		})
	}
	t.Logf("processor parity against transformers 5.17:\n%s", strings.Join(rows, "\n"))
}

// readPNG returns the RGB pixels of a golden PNG (transformers' resized image, or Pillow's
// decoded JPEG), or nil when the golden run did not return it.
func absDiff(a, b uint8) uint8 {
	if a > b {
		return a - b
	}
	return b - a
}

func readPNG(t *testing.T, path string) []uint8 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	im, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return ToRGB(im.(image.Image))
}

// TestSmartResize checks the rounding rules against values worked by hand from transformers'
// smart_resize (factor 32, min 4096, max 65536).
func TestSmartResize(t *testing.T) {
	for _, c := range []struct{ h, w, wh, ww int }{
		{480, 640, 192, 288}, // over max: floor after scaling
		{40, 40, 64, 64},     // under min: ceil after scaling
		{80, 120, 64, 128},   // 80/32 = 2.5 rounds to even (2)
		{60, 1200, 32, 1120}, // 1200/32 = 37.5 rounds to 38, then over max
		{1, 1, 64, 64},       // 1x1
		{600, 4, 800, 32},    // thin
		{144, 144, 128, 128}, // 4.5 rounds to 4
		{208, 208, 192, 192}, // 6.5 rounds to 6
	} {
		h, w, err := SmartResize(c.h, c.w, 32, 4096, 65536)
		if err != nil || h != c.wh || w != c.ww {
			t.Errorf("SmartResize(%d, %d) = %d, %d, %v; want %d, %d", c.h, c.w, h, w, err, c.wh, c.ww)
		}
	}
	if _, _, err := SmartResize(1, 201, 32, 4096, 65536); err == nil || !strings.Contains(err.Error(), "aspect ratio") {
		t.Errorf("aspect 201 accepted: %v", err)
	}
}
