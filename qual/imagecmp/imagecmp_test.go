package imagecmp

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestMatchesScikitImage: the stored pairs (diffusers images and perturbations of them, see
// fixtures/golden/make_zimage_golden.py) give scikit-image's PSNR and SSIM.
func TestMatchesScikitImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "fixtures", "golden", "zimage-tiny.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		ImageMetrics struct {
			Skimage string `json:"skimage"`
			Pairs   []struct {
				A, B    string
				APixels string `json:"a_pixels"`
				BPixels string `json:"b_pixels"`
				Shape   []int  `json:"shape"`
				PSNR    float64
				SSIM    float64
			} `json:"pairs"`
		} `json:"image_metrics"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.ImageMetrics.Pairs) == 0 {
		t.Fatal("the golden has no scikit-image pairs")
	}
	for _, p := range g.ImageMetrics.Pairs {
		ap, _ := base64.StdEncoding.DecodeString(p.APixels)
		bp, _ := base64.StdEncoding.DecodeString(p.BPixels)
		a := Image{Height: p.Shape[0], Width: p.Shape[1], Channels: p.Shape[2], Pix: ap}
		bi := Image{Height: p.Shape[0], Width: p.Shape[1], Channels: p.Shape[2], Pix: bp}
		psnr, err := PSNR(a, bi)
		if err != nil {
			t.Fatal(err)
		}
		ssim, err := SSIM(a, bi)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(psnr-p.PSNR) > 1e-9*math.Abs(p.PSNR) || math.Abs(ssim-p.SSIM) > 1e-9 {
			t.Errorf("%s vs %s: PSNR %.12g SSIM %.12g; scikit-image %s gave %.12g and %.12g", p.A, p.B, psnr, ssim, g.ImageMetrics.Skimage, p.PSNR, p.SSIM)
		}
		t.Logf("%s vs %s: PSNR %.4f dB, SSIM %.6f (scikit-image %.4f, %.6f)", p.A, p.B, psnr, ssim, p.PSNR, p.SSIM)
	}
}

func TestIdenticalAndRefusals(t *testing.T) {
	px := make([]byte, 8*8*3)
	for i := range px {
		px[i] = byte(i * 7)
	}
	a := Image{Width: 8, Height: 8, Channels: 3, Pix: px}
	if p, _ := PSNR(a, a); !math.IsInf(p, 1) {
		t.Errorf("PSNR of an image with itself is %v, want +Inf", p)
	}
	if s, _ := SSIM(a, a); math.Abs(s-1) > 1e-12 {
		t.Errorf("SSIM of an image with itself is %v, want 1", s)
	}
	if _, err := SSIM(a, Image{Width: 4, Height: 16, Channels: 3, Pix: make([]byte, 4*16*3)}); err == nil {
		t.Error("SSIM of differently shaped images gave no error")
	}
}
