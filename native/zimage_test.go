package native

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

type zimageCase struct {
	Name           string  `json:"name"`
	Width          int     `json:"width"`
	Height         int     `json:"height"`
	Steps          int     `json:"steps"`
	Guidance       float32 `json:"guidance"`
	Seed           uint64  `json:"seed"`
	InputIDs       []int32 `json:"input_ids"`
	InitialLatents string  `json:"initial_latents"`
	StepsLatents   []struct {
		Latents string `json:"latents"`
	} `json:"steps_latents"`
	Image  string `json:"image"`
	Pixels string `json:"pixels"`
}

// TestZImageMatchesDiffusers runs the zimage-tiny pipeline on every golden case and compares
// the latents after each step, the float image and the 8-bit pixels with diffusers' (CPU fp32).
func TestZImageMatchesDiffusers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "fixtures", "golden", "zimage-tiny.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []zimageCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	path, err := fixtures.Bundle(fixtures.DefaultCacheDir(), fixtures.ZImageTiny)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := bundle.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer bd.Close()
	e, err := Open(bd, Params{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, c := range g.Cases {
		// The negative prompt "" under the same chat template: the prompt's ids without the
		// user text (3 ids before it, 5 after).
		neg := append(append([]int32{}, c.InputIDs[:3]...), c.InputIDs[len(c.InputIDs)-5:]...)
		res, err := e.GenerateImage(ImageRequest{Prompt: c.InputIDs, Negative: neg, Width: c.Width, Height: c.Height, Steps: c.Steps, Guidance: c.Guidance, Seed: c.Seed}, true)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		n := len(res.Latents) / (c.Steps + 1)
		for i := 0; i <= c.Steps; i++ {
			var want []float32
			if i == 0 {
				want = decodeF32(t, c.InitialLatents)
			} else {
				want = decodeF32(t, c.StepsLatents[i-1].Latents)
			}
			d := maxDiff(res.Latents[i*n:(i+1)*n], want)
			t.Logf("%s: latents %d max|diff| %.3g", c.Name, i, d)
			if d > 1e-4 {
				t.Errorf("%s: latents after step %d differ from diffusers' by %.3g (> 1e-4)", c.Name, i, d)
			}
		}
		if d := maxDiff(res.Image, decodeF32(t, c.Image)); d > 1e-4 {
			t.Errorf("%s: float image differs from diffusers' by %.3g (> 1e-4)", c.Name, d)
		}
		px, _ := base64.StdEncoding.DecodeString(c.Pixels)
		mse := 0.0
		for i := range px {
			d := float64(px[i]) - float64(res.RGB[i])
			mse += d * d
		}
		mse /= float64(len(px))
		psnr := 10 * math.Log10(255*255/mse)
		t.Logf("%s: pixels PSNR %.2f dB (mse %.4g), pipeline %v", c.Name, psnr, mse, res.PipelineTime)
		if psnr < 40 {
			t.Errorf("%s: PSNR %.2f dB against diffusers' pixels, want >= 40", c.Name, psnr)
		}
	}
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	m := 0.0
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}
