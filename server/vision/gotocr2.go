package vision

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// The GOT-OCR2 image processor as transformers 5.17's GotOcr2ImageProcessor (torchvision
// backend, also registered as GotOcr2ImageProcessorFast) runs it under InternVLProcessor, for
// InternVL checkpoints (the internvl family): the image is cut into square tiles on the grid
// whose aspect ratio is closest to the image's (get_optimal_tiled_canvas), resized to
// (tile*cols, tile*rows) with the antialiased bicubic resize torchvision applies to 8-bit
// images, cropped row-major, followed by a thumbnail of the whole image when there is more than
// one tile; then rescaled and normalised with the checkpoint's mean and std. InternVLProcessor
// always crops (its images_kwargs default crop_to_patches=True overrides the file's false).

func init() {
	Register(func(b []byte) (Processor, error) { return ParseGotOcr2Config(b) },
		"GotOcr2ImageProcessor", "GotOcr2ImageProcessorFast")
}

// The class defaults transformers falls back to when the file omits mean or std
// (OPENAI_CLIP_MEAN / OPENAI_CLIP_STD). Converted InternVL checkpoints store ImageNet's values
// instead, so the file's values are the ones that count.
var (
	openAIClipMean = []float64{0.48145466, 0.4578275, 0.40821073}
	openAIClipStd  = []float64{0.26862954, 0.26130258, 0.27577711}
)

// GotOcr2Config is the part of preprocessor_config.json the GOT-OCR2 processor reads, plus what
// the model's config.json adds (UseModelConfig): the tile's patch size and the image tokens
// per tile.
type GotOcr2Config struct {
	Size struct {
		Height int `json:"height"`
		Width  int `json:"width"`
	} `json:"size"`
	MinPatches    int       `json:"min_patches"`
	MaxPatches    int       `json:"max_patches"`
	ImageMean     []float64 `json:"image_mean"`
	ImageStd      []float64 `json:"image_std"`
	RescaleFactor float64   `json:"rescale_factor"`
	Resample      int       `json:"resample"`
	DoResize      *bool     `json:"do_resize"`
	DoRescale     *bool     `json:"do_rescale"`
	DoNormalize   *bool     `json:"do_normalize"`
	DoConvertRGB  *bool     `json:"do_convert_rgb"`
	DoCenterCrop  *bool     `json:"do_center_crop"`
	// ImageSeqLength is InternVLProcessor's image_seq_length: placeholder tokens per tile
	// (processor_config.json's top level, or config.json's image_seq_length).
	ImageSeqLength int `json:"image_seq_length"`
	// PatchSize is the vision tower's patch side (config.json's vision_config.patch_size); it
	// only shapes Result.Grid.
	PatchSize int `json:"-"`
}

// ParseGotOcr2Config reads preprocessor_config.json (or processor_config.json, whose
// image_processor block NewProcessor has unwrapped) and refuses settings this processor does not
// implement.
func ParseGotOcr2Config(b []byte) (*GotOcr2Config, error) {
	c := &GotOcr2Config{MinPatches: 1, MaxPatches: 12, RescaleFactor: 1.0 / 255, Resample: 3, ImageSeqLength: 256, PatchSize: 14}
	c.Size.Height, c.Size.Width = 384, 384 // the class default; InternVL checkpoints store 448
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("preprocessor_config.json: %w", err)
	}
	if c.ImageMean == nil {
		c.ImageMean = openAIClipMean
	}
	if c.ImageStd == nil {
		c.ImageStd = openAIClipStd
	}
	bad := func(field, why string) error {
		return fmt.Errorf("preprocessor_config.json: %s %s; this processor implements GOT-OCR2's tiling as InternVLProcessor runs it", field, why)
	}
	switch {
	case c.Size.Height <= 0 || c.Size.Width <= 0:
		return nil, bad("size.height/size.width", fmt.Sprintf("are %d/%d; both must be positive", c.Size.Height, c.Size.Width))
	case c.Size.Height != c.Size.Width:
		return nil, bad("size", fmt.Sprintf("is %dx%d; tiles must be square (transformers picks the grid by height alone)", c.Size.Width, c.Size.Height))
	case c.MinPatches < 1 || c.MaxPatches < c.MinPatches:
		return nil, bad("min_patches/max_patches", fmt.Sprintf("are %d/%d; need 1 <= min_patches <= max_patches", c.MinPatches, c.MaxPatches))
	case c.Resample != 3:
		return nil, bad("resample", fmt.Sprintf("is %d, not 3 (bicubic)", c.Resample))
	case len(c.ImageMean) != 3 || len(c.ImageStd) != 3:
		return nil, bad("image_mean/image_std", "must have 3 entries")
	case c.RescaleFactor <= 0:
		return nil, bad("rescale_factor", "must be positive")
	case c.ImageSeqLength <= 0:
		return nil, bad("image_seq_length", "must be positive")
	case c.DoResize != nil && !*c.DoResize, c.DoRescale != nil && !*c.DoRescale,
		c.DoNormalize != nil && !*c.DoNormalize, c.DoConvertRGB != nil && !*c.DoConvertRGB:
		return nil, bad("do_resize/do_rescale/do_normalize/do_convert_rgb", "false is not supported")
	case c.DoCenterCrop != nil && *c.DoCenterCrop:
		return nil, bad("do_center_crop", "true is not supported")
	}
	if slices.Contains(c.ImageStd, 0) {
		return nil, bad("image_std", "has a zero")
	}
	return c, nil
}

// UseModelConfig reads what InternVLProcessor and the model add to the image processor's file:
// image_seq_length (tokens per tile) and vision_config.patch_size, from the checkpoint's
// config.json. Missing keys keep what the processor file said (or transformers' defaults).
func (c *GotOcr2Config) UseModelConfig(config []byte) error {
	var m struct {
		ImageSeqLength *int `json:"image_seq_length"`
		Vision         struct {
			PatchSize json.RawMessage `json:"patch_size"`
			ImageSize json.RawMessage `json:"image_size"`
		} `json:"vision_config"`
	}
	if err := json.Unmarshal(config, &m); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	if m.ImageSeqLength != nil {
		if *m.ImageSeqLength <= 0 {
			return fmt.Errorf("config.json: image_seq_length %d must be positive", *m.ImageSeqLength)
		}
		c.ImageSeqLength = *m.ImageSeqLength
	}
	side := func(raw json.RawMessage, field string) (int, error) {
		if len(raw) == 0 {
			return 0, nil
		}
		var one int
		if json.Unmarshal(raw, &one) == nil {
			return one, nil
		}
		var two []int
		if json.Unmarshal(raw, &two) == nil && len(two) == 2 && two[0] == two[1] {
			return two[0], nil
		}
		return 0, fmt.Errorf("config.json: vision_config.%s must be an integer or a square [h, w]", field)
	}
	p, err := side(m.Vision.PatchSize, "patch_size")
	if err != nil {
		return err
	}
	if p > 0 {
		c.PatchSize = p
	}
	is, err := side(m.Vision.ImageSize, "image_size")
	if err != nil {
		return err
	}
	if is > 0 && is != c.Size.Height {
		return fmt.Errorf("config.json: vision_config.image_size %d differs from the image processor's tile size %d; the tower takes tiles of its image_size", is, c.Size.Height)
	}
	if c.Size.Height%c.PatchSize != 0 {
		return fmt.Errorf("config.json: vision_config.patch_size %d does not divide the tile size %d", c.PatchSize, c.Size.Height)
	}
	return nil
}

// StacksImages: GOT-OCR2 tiles are fixed squares encoded one by one, so several images stack.
func (c *GotOcr2Config) StacksImages() {}

// Frame names the tokens InternVLProcessor puts around an image's placeholder tokens.
func (c *GotOcr2Config) Frame() (start, end string) { return "<img>", "</img>" }

// TileGrid is transformers' get_optimal_tiled_canvas: among the (cols, rows) grids with
// minTiles <= cols*rows <= maxTiles, listed cols-major then stably sorted by tile count, the one
// whose aspect ratio cols/rows is closest to width/height (float64, as Python computes it).
// On an exact tie the later grid (more tiles) wins while the image's area is more than half the
// grid's area in pixels (area > 0.5 * tile^2 * cols * rows), so a small image is not blown up
// onto many tiles.
func TileGrid(width, height, tile, minTiles, maxTiles int) (cols, rows int) {
	type grid struct{ c, r int }
	var grids []grid
	for c := 1; c <= maxTiles; c++ {
		for r := 1; r <= maxTiles; r++ {
			if c*r <= maxTiles && c*r >= minTiles {
				grids = append(grids, grid{c, r})
			}
		}
	}
	slices.SortStableFunc(grids, func(a, b grid) int { return a.c*a.r - b.c*b.r })
	aspect := float64(width) / float64(height)
	area := float64(width * height)
	best, bestDiff := grid{1, 1}, math.Inf(1)
	for _, g := range grids {
		diff := math.Abs(aspect - float64(g.c)/float64(g.r))
		if diff < bestDiff {
			best, bestDiff = g, diff
		} else if diff == bestDiff && area > 0.5*float64(tile)*float64(tile)*float64(g.c*g.r) {
			best = g
		}
	}
	return best.c, best.r
}

// Preprocess runs the processor on an RGB image (row-major, 3 bytes a pixel; see ToRGB).
// Result.Pixels holds the tiles then the thumbnail, each [3, tile, tile] (channels first);
// Result.Grid is (tiles, tile/patch, tile/patch); Result.Resized is the tiled resize
// (tile*cols x tile*rows) before cropping; Result.Tokens is image_seq_length per tile.
func (c *GotOcr2Config) Preprocess(rgb []uint8, width, height int) (*Result, error) {
	if len(rgb) != width*height*3 {
		return nil, fmt.Errorf("vision: %d bytes for a %dx%d RGB image", len(rgb), width, height)
	}
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("image is %dx%d; it needs at least one pixel", width, height)
	}
	t := c.Size.Height
	cols, rows := 1, 1
	if c.MaxPatches > 1 {
		cols, rows = TileGrid(width, height, t, c.MinPatches, c.MaxPatches)
	}
	rw, rh := t*cols, t*rows
	resized := ResizeBicubic(rgb, width, height, rw, rh)
	tiles := cols * rows
	var thumb []uint8
	if tiles > 1 {
		thumb = ResizeBicubic(rgb, width, height, t, t)
		tiles++
	}
	var mean, std [3]float32
	for ch := 0; ch < 3; ch++ {
		mean[ch] = float32(c.ImageMean[ch] * (1 / c.RescaleFactor))
		std[ch] = float32(c.ImageStd[ch] * (1 / c.RescaleFactor))
	}
	r := &Result{Width: width, Height: height, ResizedWidth: rw, ResizedHeight: rh, Resized: resized,
		Grid: [3]int{tiles, t / c.PatchSize, t / c.PatchSize}, Tokens: tiles * c.ImageSeqLength, Tiles: tiles}
	r.Pixels = make([]float32, tiles*3*t*t)
	// put writes the t x t window at (x0, y0) of src (stride sw pixels) as tile i, channels first.
	put := func(i int, src []uint8, sw, x0, y0 int) {
		out := r.Pixels[i*3*t*t:]
		for ch := 0; ch < 3; ch++ {
			for y := 0; y < t; y++ {
				row := src[((y0+y)*sw+x0)*3+ch:]
				o := out[(ch*t+y)*t:]
				for x := 0; x < t; x++ {
					o[x] = (float32(row[3*x]) - mean[ch]) / std[ch]
				}
			}
		}
	}
	for i := 0; i < cols*rows; i++ {
		put(i, resized, rw, (i%cols)*t, (i/cols)*t)
	}
	if thumb != nil {
		put(cols*rows, thumb, t, 0, 0)
	}
	return r, nil
}
