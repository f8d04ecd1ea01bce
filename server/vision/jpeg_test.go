package vision

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestJPEGMatchesLibjpeg holds Decode to libjpeg-turbo's own decoding (JDCT_ISLOW, fancy
// upsampling: what Pillow runs) on JPEGs the corpus lacks: 4:1:1, 4:2:2 with restart markers,
// progressive 4:4:0, progressive 4:2:0 with restart markers (which Go's image/jpeg refuses), and
// a 5x7 4:2:0 image (a downsampled width of 3). testdata/libjpeg and the RGB sha256 of
// libjpeg's decoding come from `JPEGREF_OUT=server/vision/testdata/libjpeg go run -tags jpegref
// ./lab/jpegref` (Debian's libjpeg62-turbo 2.1.5); that run compares 216 such JPEGs.
func TestJPEGMatchesLibjpeg(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "libjpeg", "libjpeg.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		RGBSHA256 map[string]string `json:"rgb_sha256"`
	}
	if err := json.Unmarshal(b, &ref); err != nil || len(ref.RGBSHA256) == 0 {
		t.Fatalf("libjpeg.json: %v", err)
	}
	for name, want := range ref.RGBSHA256 {
		data, err := os.ReadFile(filepath.Join("testdata", "libjpeg", name))
		if err != nil {
			t.Fatal(err)
		}
		im, err := Decode(data, "image/jpeg", 1<<20)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if im.PixelsSHA256 != want {
			t.Errorf("%s: decoded pixels differ from libjpeg-turbo's (sha256 %s, want %s)", name, im.PixelsSHA256, want)
		}
	}
}
