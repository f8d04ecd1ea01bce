package vision

import (
	"encoding/json"
	"fmt"
	"math"
)

// The Qwen2-VL image processor, as transformers' Qwen2VLImageProcessor and
// Qwen2VLImageProcessorFast compute it for Qwen3-VL checkpoints (the qwen3vl family): smart
// resize to multiples of patch x merge, RGB conversion onto white, antialiased bicubic resize
// as torchvision computes it on 8-bit images, rescale and normalise, patch layout.

func init() {
	Register(func(b []byte) (Processor, error) { return ParseConfig(b) },
		"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
}

// Config is the part of preprocessor_config.json the Qwen2-VL image processor reads.
type Config struct {
	PatchSize         int       `json:"patch_size"`
	TemporalPatchSize int       `json:"temporal_patch_size"`
	MergeSize         int       `json:"merge_size"`
	ImageMean         []float64 `json:"image_mean"`
	ImageStd          []float64 `json:"image_std"`
	RescaleFactor     float64   `json:"rescale_factor"`
	Resample          int       `json:"resample"`
	DoResize          *bool     `json:"do_resize"`
	DoRescale         *bool     `json:"do_rescale"`
	DoNormalize       *bool     `json:"do_normalize"`
	DoConvertRGB      *bool     `json:"do_convert_rgb"`
	Size              struct {
		ShortestEdge int `json:"shortest_edge"` // min pixels
		LongestEdge  int `json:"longest_edge"`  // max pixels
	} `json:"size"`
	MinPixels int `json:"min_pixels"` // older configs: take precedence when set
	MaxPixels int `json:"max_pixels"`
}

// ParseConfig reads preprocessor_config.json and refuses settings this processor does not
// implement (rather than computing something else).
func ParseConfig(b []byte) (*Config, error) {
	c := &Config{PatchSize: 16, TemporalPatchSize: 2, MergeSize: 2, RescaleFactor: 1.0 / 255, Resample: 3}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("preprocessor_config.json: %w", err)
	}
	if c.MinPixels == 0 {
		c.MinPixels = c.Size.ShortestEdge
	}
	if c.MaxPixels == 0 {
		c.MaxPixels = c.Size.LongestEdge
	}
	bad := func(field, why string) error {
		return fmt.Errorf("preprocessor_config.json: %s %s; this processor implements Qwen2-VL's settings", field, why)
	}
	switch {
	case c.PatchSize <= 0 || c.TemporalPatchSize <= 0 || c.MergeSize <= 0:
		return nil, bad("patch_size/temporal_patch_size/merge_size", "must be positive")
	case c.MinPixels <= 0 || c.MaxPixels < c.MinPixels:
		return nil, bad("size.shortest_edge/longest_edge (min/max pixels)", fmt.Sprintf("are %d/%d", c.MinPixels, c.MaxPixels))
	case c.Resample != 3:
		return nil, bad("resample", fmt.Sprintf("is %d, not 3 (bicubic)", c.Resample))
	case len(c.ImageMean) != 3 || len(c.ImageStd) != 3:
		return nil, bad("image_mean/image_std", "must have 3 entries")
	case c.DoResize != nil && !*c.DoResize, c.DoRescale != nil && !*c.DoRescale,
		c.DoNormalize != nil && !*c.DoNormalize, c.DoConvertRGB != nil && !*c.DoConvertRGB:
		return nil, bad("do_resize/do_rescale/do_normalize/do_convert_rgb", "false is not supported")
	}
	for _, s := range c.ImageStd {
		if s == 0 {
			return nil, bad("image_std", "has a zero")
		}
	}
	return c, nil
}

// Factor is the side every resized image is a multiple of (patch size x merge size).
// KeepsOwnGrids: each image has its own grid (its own size in patches), so several go to the
// engine as a list (vision.OwnGrids).
func (c *Config) KeepsOwnGrids() {}

func (c *Config) Factor() int { return c.PatchSize * c.MergeSize }

// maxAspect is transformers' limit on max(h, w) / min(h, w) (smart_resize's MAX_RATIO).
const maxAspect = 200

// SmartResize is transformers' Qwen2-VL smart_resize: both sides rounded to the nearest multiple
// of factor (Python's round: half to even), then scaled down (floor) to fit max pixels or up
// (ceil) to reach min pixels, keeping the aspect ratio as nearly as the factor allows.
func SmartResize(height, width, factor, minPixels, maxPixels int) (int, int, error) {
	if height <= 0 || width <= 0 {
		return 0, 0, fmt.Errorf("image is %dx%d; it needs at least one pixel", width, height)
	}
	if r := float64(max(height, width)) / float64(min(height, width)); r > maxAspect {
		return 0, 0, fmt.Errorf("image is %dx%d: aspect ratio %.1f is over the processor's limit of %d", width, height, r, maxAspect)
	}
	f := float64(factor)
	h := int(math.RoundToEven(float64(height)/f)) * factor
	w := int(math.RoundToEven(float64(width)/f)) * factor
	if h*w > maxPixels {
		beta := math.Sqrt(float64(height*width) / float64(maxPixels))
		h = max(factor, int(math.Floor(float64(height)/beta/f))*factor)
		w = max(factor, int(math.Floor(float64(width)/beta/f))*factor)
	} else if h*w < minPixels {
		beta := math.Sqrt(float64(minPixels) / float64(height*width))
		h = int(math.Ceil(float64(height)*beta/f)) * factor
		w = int(math.Ceil(float64(width)*beta/f)) * factor
	}
	return h, w, nil
}

// Preprocess runs the processor on an RGB image (row-major, 3 bytes a pixel; see ToRGB).
func (c *Config) Preprocess(rgb []uint8, width, height int) (*Result, error) {
	if len(rgb) != width*height*3 {
		return nil, fmt.Errorf("vision: %d bytes for a %dx%d RGB image", len(rgb), width, height)
	}
	rh, rw, err := SmartResize(height, width, c.Factor(), c.MinPixels, c.MaxPixels)
	if err != nil {
		return nil, err
	}
	resized := ResizeBicubic(rgb, width, height, rw, rh)
	r := &Result{Width: width, Height: height, ResizedWidth: rw, ResizedHeight: rh, Resized: resized}
	p, tp, m := c.PatchSize, c.TemporalPatchSize, c.MergeSize
	gh, gw := rh/p, rw/p
	r.Grid = [3]int{1, gh, gw}
	r.Tokens = gh * gw / (m * m)
	// transformers fuses rescale and normalise: (x - mean/rescale) / (std/rescale) in float32.
	var mean, std [3]float32
	for ch := 0; ch < 3; ch++ {
		mean[ch] = float32(c.ImageMean[ch] * (1 / c.RescaleFactor))
		std[ch] = float32(c.ImageStd[ch] * (1 / c.RescaleFactor))
	}
	// Patch order (t, gh/m, gw/m, m, m, C, tp, p, p): the one image is repeated over the
	// temporal patch.
	row := 3 * tp * p * p
	r.Pixels = make([]float32, gh*gw*row)
	i := 0
	for bh := 0; bh < gh/m; bh++ {
		for bw := 0; bw < gw/m; bw++ {
			for mh := 0; mh < m; mh++ {
				for mw := 0; mw < m; mw++ {
					y0, x0 := (bh*m+mh)*p, (bw*m+mw)*p
					for ch := 0; ch < 3; ch++ {
						for t := 0; t < tp; t++ {
							for y := 0; y < p; y++ {
								src := resized[((y0+y)*rw+x0)*3+ch:]
								for x := 0; x < p; x++ {
									r.Pixels[i] = (float32(src[3*x]) - mean[ch]) / std[ch]
									i++
								}
							}
						}
					}
				}
			}
		}
	}
	return r, nil
}
