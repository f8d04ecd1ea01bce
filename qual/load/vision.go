package load

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ImageOptions puts one image into every chat request of a load run (a vision-language
// endpoint): files from Dir, in name order and round robin, or synthetic images whose width and
// height are drawn around WidthMean/HeightMean (AIPerf's --image-width-mean,
// --image-height-mean, --image-width-stddev, --image-height-stddev, --image-format).
type ImageOptions struct {
	Dir                       string
	WidthMean, HeightMean     int
	WidthStddev, HeightStddev int
	Format                    string // png | jpeg (synthetic images)
	Seed                      uint64
	// Fraction of the prompts that carry an image, spread evenly (prompt i has one when
	// floor((i+1)F) > floor(iF)); the others stay text-only, so one run measures TTFT with and
	// without an image. 0 means 1: every prompt.
	Fraction float64
	// PerRequest is how many images a request that carries images holds (AIPerf's
	// --batch-size-image; a server takes more than one with qual-server's
	// --max-images-per-request); 0 means 1.
	PerRequest int
}

// Enabled reports whether the options ask for images.
func (o ImageOptions) Enabled() bool { return o.Dir != "" || o.WidthMean > 0 || o.HeightMean > 0 }

// WithImages turns every prompt (or the o.Fraction of them) into one user message holding
// o.PerRequest image parts (data: URLs, one by default) followed by the prompt's text. Prompts
// that are already conversations get the images prepended to their first user message's
// content.
func WithImages(prompts []Prompt, o ImageOptions) ([]Prompt, error) {
	k := max(o.PerRequest, 1)
	urls, err := imageURLs(len(prompts)*k, o)
	if err != nil {
		return nil, err
	}
	if o.Fraction < 0 || o.Fraction > 1 {
		return nil, fmt.Errorf("load.WithImages: image fraction %v must be in (0, 1]", o.Fraction)
	}
	out := make([]Prompt, len(prompts))
	for i, p := range prompts {
		// Prompt i carries an image when ⌊i·f⌋ steps past ⌊(i−1)·f⌋: a fraction f of the
		// prompts, spread evenly, the first among them, so that the warmup (which sends the
		// first prompts) runs the vision encoder and image preprocessing before anything is
		// measured, and with two warmup requests or more the text-only path too.
		if f := o.Fraction; f > 0 && f < 1 && math.Floor(float64(i)*f) == math.Floor(float64(i-1)*f) {
			out[i] = p // text-only
			continue
		}
		var parts []any
		for j := 0; j < k; j++ {
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": urls[(i*k+j)%len(urls)]}})
		}
		var msgs []map[string]any
		if len(p.Messages) > 0 {
			if err := json.Unmarshal(p.Messages, &msgs); err != nil {
				return nil, fmt.Errorf("load.WithImages: prompt %q: messages: %w", p.Name, err)
			}
		} else {
			msgs = []map[string]any{{"role": "user", "content": p.Prompt}}
		}
		placed := false
		for _, m := range msgs {
			if m["role"] != "user" {
				continue
			}
			switch c := m["content"].(type) {
			case string:
				m["content"] = append(parts, map[string]any{"type": "text", "text": c})
			case []any:
				m["content"] = append(parts, c...)
			default:
				return nil, fmt.Errorf("load.WithImages: prompt %q: a user message's content is %T", p.Name, c)
			}
			placed = true
			break
		}
		if !placed {
			return nil, fmt.Errorf("load.WithImages: prompt %q has no user message to carry the image", p.Name)
		}
		b, err := json.Marshal(msgs)
		if err != nil {
			return nil, err
		}
		p.Messages = b
		out[i] = p
	}
	return out, nil
}

func imageURLs(n int, o ImageOptions) ([]string, error) {
	if o.Dir != "" {
		ents, err := os.ReadDir(o.Dir)
		if err != nil {
			return nil, fmt.Errorf("load: image folder: %w", err)
		}
		var names []string
		for _, e := range ents {
			low := strings.ToLower(e.Name())
			if !e.IsDir() && (strings.HasSuffix(low, ".png") || strings.HasSuffix(low, ".jpg") || strings.HasSuffix(low, ".jpeg")) {
				names = append(names, e.Name())
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("load: image folder %s holds no .png, .jpg or .jpeg file", o.Dir)
		}
		sort.Strings(names)
		var urls []string
		for _, name := range names {
			b, err := os.ReadFile(filepath.Join(o.Dir, name))
			if err != nil {
				return nil, fmt.Errorf("load: image: %w", err)
			}
			mime := "image/png"
			if !strings.HasSuffix(strings.ToLower(name), ".png") {
				mime = "image/jpeg"
			}
			urls = append(urls, "data:"+mime+";base64,"+base64.StdEncoding.EncodeToString(b))
		}
		return urls, nil
	}
	if o.WidthMean <= 0 || o.HeightMean <= 0 {
		return nil, fmt.Errorf("load: synthetic images need --image-width-mean and --image-height-mean above 0 (or --image-dir)")
	}
	format := strings.ToLower(o.Format)
	if format == "" {
		format = "png"
	}
	if format == "jpg" {
		format = "jpeg"
	}
	if format != "png" && format != "jpeg" {
		return nil, fmt.Errorf("load: --image-format %q must be png or jpeg", o.Format)
	}
	g := newNormalSource(o.Seed ^ 0x494d4147)
	urls := make([]string, n)
	for i := range urls {
		w := max(1, int(math.Round(float64(o.WidthMean)+float64(o.WidthStddev)*g.normal())))
		h := max(1, int(math.Round(float64(o.HeightMean)+float64(o.HeightStddev)*g.normal())))
		im := image.NewRGBA(image.Rect(0, 0, w, h))
		// A smooth field with a per-image phase: every request's image differs, so no cache
		// along the way can answer it.
		ph := g.uniform() * 6.28
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				v := math.Sin(float64(x)/17+ph)*0.5 + 0.5
				u := math.Cos(float64(y)/23-ph)*0.5 + 0.5
				im.Set(x, y, color.RGBA{uint8(255 * v), uint8(255 * u), uint8(255 * v * u), 255})
			}
		}
		var buf bytes.Buffer
		var err error
		if format == "png" {
			err = png.Encode(&buf, im)
		} else {
			err = jpeg.Encode(&buf, im, &jpeg.Options{Quality: 90})
		}
		if err != nil {
			return nil, err
		}
		urls[i] = "data:image/" + format + ";base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
	}
	return urls, nil
}

// normalSource is SplitMix64 with Box-Muller normals, so a seed reproduces the images.
type normalSource struct{ s uint64 }

func newNormalSource(seed uint64) *normalSource { return &normalSource{s: seed} }

func (g *normalSource) next() uint64 {
	g.s += 0x9E3779B97F4A7C15
	z := g.s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func (g *normalSource) uniform() float64 { return float64(g.next()>>11) / (1 << 53) }

func (g *normalSource) normal() float64 {
	u := math.Max(g.uniform(), 1e-300)
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*g.uniform())
}
