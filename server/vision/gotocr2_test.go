package vision

import (
	"strings"
	"testing"
)

// TestTileGrid checks the grid choice against transformers' get_optimal_tiled_canvas worked by
// hand (tile 448): the grids with min <= cols*rows <= max sorted by tile count, the closest
// aspect ratio, and on an exact tie the later grid while the image's area exceeds half the
// grid's pixel area.
func TestTileGrid(t *testing.T) {
	for _, c := range []struct {
		w, h, max  int
		cols, rows int
		why        string
	}{
		{448, 448, 12, 1, 1, "square: (1,1); (2,2) ties but 448^2 is not > 0.5*448^2*4"},
		{1000, 1000, 12, 3, 3, "square: ties (2,2) then (3,3) win since 1e6 > 0.5*448^2*9 = 903168"},
		{1400, 1400, 12, 3, 3, "(4,4) has 16 tiles, over max 12"},
		{800, 400, 12, 2, 1, "ratio 2: (4,2) ties but 320000 is not > 802816"},
		{1, 1, 12, 1, 1, "one pixel"},
		{4, 600, 12, 1, 12, "tall: the narrowest grid"},
		{4, 600, 6, 1, 6, "tall with max 6"},
		{600, 4, 6, 6, 1, "wide with max 6"},
		{600, 400, 6, 3, 2, "ratio 1.5: (3,2) exactly"},
		{1000, 400, 6, 3, 1, "ratio 2.5: (2,1) and (3,1) tie at 0.5; 400000 > 0.5*448^2*3 = 301056 takes (3,1)"},
		{500, 200, 6, 2, 1, "ratio 2.5, small: 100000 is not > 301056, (2,1) stays"},
		{200, 500, 6, 1, 3, "ratio 0.4: (1,3) diff 0.0667 beats (1,2) diff 0.1"},
		{300, 1000, 6, 1, 3, "ratio 0.3: (1,3) diff 0.0333 beats (1,4) diff 0.05"},
	} {
		cols, rows := TileGrid(c.w, c.h, 448, 1, c.max)
		if cols != c.cols || rows != c.rows {
			t.Errorf("%dx%d max %d: grid (%d,%d), want (%d,%d): %s", c.w, c.h, c.max, cols, rows, c.cols, c.rows, c.why)
		}
	}
	if c, r := TileGrid(448, 448, 448, 2, 6); c*r < 2 {
		t.Errorf("min_patches 2: grid (%d,%d) has fewer than 2 tiles", c, r)
	}
}

const gotOcr2Test = `{"crop_to_patches": false, "do_convert_rgb": true, "do_normalize": true, "do_rescale": true,
	"do_resize": true, "image_mean": [0.485, 0.456, 0.406], "image_processor_type": "GotOcr2ImageProcessorFast",
	"image_std": [0.229, 0.224, 0.225], "max_patches": 6, "min_patches": 1, "processor_class": "InternVLProcessor",
	"resample": 3, "rescale_factor": 0.00392156862745098, "size": {"height": 448, "width": 448}}`

// TestGotOcr2Layout checks tiles, thumbnail, token count and the channels-first layout: a
// 896x448 image of two flat halves tiles as (2,1) plus a thumbnail, tile 0 is the left colour,
// tile 1 the right one, and values are (v/255 - mean)/std.
func TestGotOcr2Layout(t *testing.T) {
	p, err := NewProcessor([]byte(gotOcr2Test))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.(ModelConfigured).UseModelConfig([]byte(`{"image_seq_length": 256, "vision_config": {"patch_size": [14, 14], "image_size": [448, 448]}}`)); err != nil {
		t.Fatal(err)
	}
	w, h := 896, 448
	rgb := make([]uint8, w*h*3)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			v := uint8(50)
			if x >= w/2 {
				v = 200
			}
			rgb[(y*w+x)*3], rgb[(y*w+x)*3+1], rgb[(y*w+x)*3+2] = v, v, v
		}
	}
	r, err := p.Preprocess(rgb, w, h)
	if err != nil {
		t.Fatal(err)
	}
	if r.Grid != [3]int{3, 32, 32} || r.Tokens != 768 || r.ResizedWidth != 896 || r.ResizedHeight != 448 {
		t.Fatalf("grid %v tokens %d resized %dx%d; want [3 32 32], 768, 896x448", r.Grid, r.Tokens, r.ResizedWidth, r.ResizedHeight)
	}
	if len(r.Pixels) != 3*3*448*448 {
		t.Fatalf("%d pixel values, want %d", len(r.Pixels), 3*3*448*448)
	}
	at := func(tile, ch, y, x int) float32 { return r.Pixels[((tile*3+ch)*448+y)*448+x] }
	want := func(v float64, ch int) float32 {
		mean := []float64{0.485, 0.456, 0.406}[ch] * 255
		std := []float64{0.229, 0.224, 0.225}[ch] * 255
		return (float32(v) - float32(mean)) / float32(std)
	}
	for ch := 0; ch < 3; ch++ {
		if got := at(0, ch, 10, 10); got != want(50, ch) {
			t.Errorf("tile 0 channel %d = %v, want %v (the left half)", ch, got, want(50, ch))
		}
		if got := at(1, ch, 10, 400); got != want(200, ch) {
			t.Errorf("tile 1 channel %d = %v, want %v (the right half)", ch, got, want(200, ch))
		}
		if a, b := at(2, ch, 200, 10), at(2, ch, 200, 440); a != want(50, ch) || b != want(200, ch) {
			t.Errorf("thumbnail channel %d edges %v %v, want both halves", ch, a, b)
		}
	}
	one, err := p.Preprocess(rgb[:3], 1, 1)
	if err != nil || one.Grid[0] != 1 || one.Tokens != 256 {
		t.Errorf("1x1: %v, grid %v; want one tile, no thumbnail", err, one.Grid)
	}
	if s, e := p.(Framed).Frame(); s != "<img>" || e != "</img>" {
		t.Errorf("frame %q %q", s, e)
	}
}

// TestGotOcr2Config checks transformers 5's processor_config.json form and the refusals.
func TestGotOcr2Config(t *testing.T) {
	p, err := NewProcessor([]byte(`{"image_processor": ` + gotOcr2Test + `, "image_seq_length": 64, "processor_class": "InternVLProcessor"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := p.(*GotOcr2Config); c.ImageSeqLength != 64 || c.MaxPatches != 6 || c.ImageMean[0] != 0.485 {
		t.Errorf("processor_config.json: got %+v, want image_seq_length 64, max_patches 6 and the stored mean", c)
	}
	for _, c := range []struct{ edit, want string }{
		{`"resample": 2`, "resample is 2"},
		{`"size": {"height": 448, "width": 224}`, "tiles must be square"},
		{`"max_patches": 0`, "min_patches/max_patches"},
		{`"do_normalize": false`, "false is not supported"},
	} {
		cfg := gotOcr2Test
		for _, k := range []string{`"resample": 3`, `"size": {"height": 448, "width": 448}`, `"max_patches": 6`, `"do_normalize": true`} {
			if strings.SplitN(k, ":", 2)[0] == strings.SplitN(c.edit, ":", 2)[0] {
				cfg = strings.Replace(cfg, k, c.edit, 1)
			}
		}
		if _, err := NewProcessor([]byte(cfg)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to say %q", c.edit, err, c.want)
		}
	}
}
