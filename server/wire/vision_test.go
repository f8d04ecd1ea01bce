package wire

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestImageFramesCarryGridLists: a SubmitImage and a LogitsImage frame round-trip one image
// (no grid list, the layout older workers read) and several images each on its own grid (the
// list), and Split cuts the pixels back per image.
func TestImageFramesCarryGridLists(t *testing.T) {
	one := &ImageInput{Grid: [3]uint32{1, 4, 4}, Pixels: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
	// Two images: grids 1x2x2 (4 patches) and 1x2x4 (8 patches), 2 values a patch.
	two := &ImageInput{Grid: [3]uint32{1, 2, 2}, Grids: [][3]uint32{{1, 2, 2}, {1, 2, 4}}}
	for i := range 24 {
		two.Pixels = append(two.Pixels, float32(i))
	}
	for _, im := range []*ImageInput{one, two} {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.SubmitImage(7, Sampling{MaxNewTokens: 3}, []int32{1, 2, 3}, im)
		w.LogitsImage(8, []int32{4, 5}, im)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		r := NewReader(&buf)
		typ, p, err := r.Next()
		if err != nil || typ != TypeSubmitImage {
			t.Fatalf("frame 1: type %d, %v", typ, err)
		}
		_, _, ids, got, err := DecodeSubmitImage(p, nil)
		if err != nil || !slices.Equal(ids, []int32{1, 2, 3}) || got.Grid != im.Grid || !slices.Equal(got.Pixels, im.Pixels) || !slices.Equal(got.Grids, im.Grids) {
			t.Fatalf("SubmitImage round trip: %v %v %+v", err, ids, got)
		}
		typ, p, err = r.Next()
		if err != nil || typ != TypeLogitsImage {
			t.Fatalf("frame 2: type %d, %v", typ, err)
		}
		_, ids, got, err = DecodeLogitsImage(p, nil)
		if err != nil || !slices.Equal(ids, []int32{4, 5}) || !slices.Equal(got.Grids, im.Grids) || !slices.Equal(got.Pixels, im.Pixels) {
			t.Fatalf("LogitsImage round trip: %v %v %+v", err, ids, got)
		}
	}
	grids, px, err := two.Split()
	if err != nil || len(grids) != 2 || len(px[0]) != 8 || len(px[1]) != 16 || px[1][0] != 8 {
		t.Fatalf("Split: %v %v %v", err, grids, px)
	}
	bad := &ImageInput{Grid: [3]uint32{1, 2, 2}, Grids: [][3]uint32{{1, 2, 2}, {1, 2, 4}}, Pixels: make([]float32, 25)}
	if _, _, err := bad.Split(); err == nil || !strings.Contains(err.Error(), "patches") {
		t.Fatalf("25 values for 12 patches: %v", err)
	}
}
