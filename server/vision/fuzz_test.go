package vision

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// FuzzDecode: any bytes and any declared type either decode into an image the processor
// handles or are refused with ErrBadImage; nothing panics, and an accepted image's size is
// bounded by the header check. Seeds: the small corpus images.
func FuzzDecode(f *testing.F) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range []string{"03-small-40x40.png", "06-pixel-1x1.png", "10-paletted-70x90.png", "08-gray-200x150.jpg"} {
		b, err := os.ReadFile(filepath.Join(root, "fixtures", "images", "qwen3vl", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, mimeOf(name))
	}
	f.Add([]byte("\x89PNG\r\n\x1a\n"), "image/png")
	f.Add([]byte{0xff, 0xd8, 0xff, 0xe0}, "")
	cfg := &Config{PatchSize: 16, TemporalPatchSize: 2, MergeSize: 2, ImageMean: []float64{0.5, 0.5, 0.5},
		ImageStd: []float64{0.5, 0.5, 0.5}, RescaleFactor: 1.0 / 255, Resample: 3, MinPixels: 4096, MaxPixels: 65536}
	f.Fuzz(func(t *testing.T, data []byte, mime string) {
		im, err := Decode(data, mime, 1<<20)
		if err != nil {
			return
		}
		if im.Width*im.Height > 1<<20 || len(im.RGB) != 3*im.Width*im.Height {
			t.Fatalf("accepted %dx%d with %d bytes", im.Width, im.Height, len(im.RGB))
		}
		r, err := cfg.Preprocess(im.RGB, im.Width, im.Height)
		if err != nil {
			return // aspect ratio over 200
		}
		if r.ResizedWidth*r.ResizedHeight > cfg.MaxPixels || r.ResizedWidth%32 != 0 || r.ResizedHeight%32 != 0 {
			t.Fatalf("resized %dx%d outside the bounds", r.ResizedWidth, r.ResizedHeight)
		}
	})
}
