package spec

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/modelqual/modelqual/qual/imagecmp"
)

// Text-to-image gates (/v1/images/generations): reference parity with diffusers' goldens,
// served bytes equal to the native command's, determinism and control sensitivity, the
// refusal contract, geometry. Each core is a Check function the planted-defect specs call.

// ImageRequest is one image request's controls.
type ImageRequest struct {
	Prompt   string  `json:"prompt"`
	Width    int     `json:"width"`
	Height   int     `json:"height"`
	Steps    int     `json:"steps"`
	Guidance float64 `json:"guidance"`
	Seed     int64   `json:"seed"`
}

// Body is r as the image gates send it to /v1/images/generations.
func (r ImageRequest) Body(model string) map[string]any {
	return map[string]any{"model": model, "prompt": r.Prompt, "size": fmt.Sprintf("%dx%d", r.Width, r.Height),
		"num_inference_steps": r.Steps, "guidance_scale": r.Guidance, "seed": r.Seed}
}

// ImageAnswer is a served image: the PNG bytes and how many images the response held.
type ImageAnswer struct {
	PNG    []byte
	Images int
}

// GenerateImage posts body to /v1/images/generations and returns the first image's PNG.
func (a *API) GenerateImage(ctx context.Context, body map[string]any) (*ImageAnswer, error) {
	return a.GenerateImageID(ctx, "", body)
}

// GenerateImageID is GenerateImage with the request's X-Request-Id set to id (none when
// empty), so a gate can find the request's server record.
func (a *API) GenerateImageID(ctx context.Context, id string, body map[string]any) (*ImageAnswer, error) {
	var out struct {
		Data []struct {
			B64 string `json:"b64_json"`
		} `json:"data"`
	}
	var hdr http.Header
	if id != "" {
		hdr = http.Header{"X-Request-Id": {id}}
	}
	resp, err := a.doHeader(ctx, http.MethodPost, "/v1/images/generations", body, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("POST /v1/images/generations: decode response: %w", err)
	}
	if len(out.Data) == 0 {
		return nil, errors.New("/v1/images/generations: the response holds no image")
	}
	b, err := base64.StdEncoding.DecodeString(out.Data[0].B64)
	if err != nil {
		return nil, fmt.Errorf("/v1/images/generations: b64_json: %w", err)
	}
	return &ImageAnswer{PNG: b, Images: len(out.Data)}, nil
}

// DecodeRGB decodes a PNG into 8-bit RGB pixels.
func DecodeRGB(b []byte) (imagecmp.Image, error) {
	m, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return imagecmp.Image{}, err
	}
	r := m.Bounds()
	out := imagecmp.Image{Width: r.Dx(), Height: r.Dy(), Channels: 3, Pix: make([]byte, 0, r.Dx()*r.Dy()*3)}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := m.At(x, y).RGBA()
			out.Pix = append(out.Pix, byte(cr>>8), byte(cg>>8), byte(cb>>8))
		}
	}
	return out, nil
}

// ImageGoldenCase is one diffusers run of fixtures/golden/<fixture>.json.
type ImageGoldenCase struct {
	Name string `json:"name"`
	ImageRequest
	Pixels string `json:"pixels"` // base64 of uint8 HWC RGB
	// StepsLatents are diffusers' latents after each step (base64 float32 LE); the last are
	// what its VAE decoded.
	StepsLatents []struct {
		Latents string `json:"latents"`
	} `json:"steps_latents"`
	LatentShape []int `json:"latent_shape"`
}

// ImageLatents is POST /mq/v1/image_latents (qual-server's introspection route): the final
// latents, before the VAE, of the generation body describes, and the sha256 of the PNG that
// run produced.
func (a *API) ImageLatents(ctx context.Context, body map[string]any) (latents []float32, shape []int, pngSHA256 string, err error) {
	const route = "/mq/v1/image_latents"
	var out struct {
		Shape     []int  `json:"latent_shape"`
		DType     string `json:"dtype"`
		Data      string `json:"data"`
		PNGSHA256 string `json:"png_sha256"`
	}
	if err := a.getJSON(ctx, "POST", route, body, &out); err != nil {
		return nil, nil, "", err
	}
	raw, err := base64.StdEncoding.DecodeString(out.Data)
	if err != nil || out.DType != "float32" || len(out.Shape) != 3 || len(raw) != 4*out.Shape[0]*out.Shape[1]*out.Shape[2] {
		return nil, nil, "", fmt.Errorf("%s: dtype %q, shape %v, %d data bytes (%v); want float32 data of that shape", route, out.DType, out.Shape, len(raw), err)
	}
	return decodeF32LE(raw), out.Shape, out.PNGSHA256, nil
}

func decodeF32LE(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

// ImageFigures are one golden case's parity figures. LatentMaxDiff is max |served - diffusers|
// over the final latents, NaN where the server has no /mq/v1/image_latents.
type ImageFigures struct {
	PSNR, SSIM, LatentMaxDiff float64
}

func (f ImageFigures) String() string {
	l := "n/a (the server has no /mq/v1/image_latents)"
	if !math.IsNaN(f.LatentMaxDiff) {
		l = fmt.Sprintf("%.3g", f.LatentMaxDiff)
	}
	return fmt.Sprintf("PSNR %.2f dB, SSIM %.6f, final latents max|diff| %s", f.PSNR, f.SSIM, l)
}

// LoadImageGolden reads the cases of a text-to-image golden file.
func LoadImageGolden(path string) ([]ImageGoldenCase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("image golden: %w (the family's script under fixtures/golden/, make_<family>_golden.py, makes it)", err)
	}
	var g struct {
		Cases []ImageGoldenCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, fmt.Errorf("image golden %s: %w", path, err)
	}
	if len(g.Cases) == 0 {
		return nil, fmt.Errorf("image golden %s has no cases", path)
	}
	return g.Cases, nil
}

// ImageInput is the input of the image gates.
type ImageInput struct {
	API *API
	// Golden holds the reference runs (diffusers on the same checkpoint).
	Golden []ImageGoldenCase
	// MinPSNR and MinSSIM bound each served image against its golden pixels (thresholds.yaml
	// psnr_min_db and ssim_min).
	MinPSNR, MinSSIM float64
	// MaxLatentDiff bounds the final latents' max |served - diffusers| where the server has
	// /mq/v1/image_latents (thresholds.yaml max_abs_latent_diff; 0: reported, not gated).
	MaxLatentDiff float64
	// QualBin and Bundle run `qual generate-image` for the served-equals-native gate, on Device
	// (the served engine's: "cuda" in a GPU run; empty: the command's default, cpu).
	QualBin, Bundle, Device string
	// SizeMultiple is the model's size grid (refusal and geometry checks).
	SizeMultiple int
}

// CheckImageParity: every golden case served over HTTP is within MinPSNR and MinSSIM of
// diffusers' pixels and, where the server exposes them (/mq/v1/image_latents, the same
// controls), its final latents are within MaxLatentDiff of diffusers' (the PNG of that run must
// be the served one). It returns each case's figures.
func CheckImageParity(ctx context.Context, in ImageInput) (map[string]ImageFigures, error) {
	figs := map[string]ImageFigures{}
	var problems []string
	withLatents, err := in.API.HasRoute(ctx, "POST", "/mq/v1/image_latents")
	if err != nil {
		return figs, fmt.Errorf("image parity: probe /mq/v1/image_latents: %w", err)
	}
	for _, c := range in.Golden {
		ans, err := in.API.GenerateImage(ctx, c.Body(in.API.Model))
		if err != nil {
			return figs, fmt.Errorf("image parity: case %q: %w", c.Name, err)
		}
		got, err := DecodeRGB(ans.PNG)
		if err != nil {
			return figs, fmt.Errorf("image parity: case %q: served PNG: %w", c.Name, err)
		}
		px, err := base64.StdEncoding.DecodeString(c.Pixels)
		if err != nil {
			return figs, fmt.Errorf("image parity: case %q: golden pixels: %w", c.Name, err)
		}
		want := imagecmp.Image{Width: c.Width, Height: c.Height, Channels: 3, Pix: px}
		psnr, err := imagecmp.PSNR(got, want)
		if err != nil {
			return figs, fmt.Errorf("image parity: case %q: %w", c.Name, err)
		}
		ssim, err := imagecmp.SSIM(got, want)
		if err != nil {
			return figs, fmt.Errorf("image parity: case %q: %w", c.Name, err)
		}
		f := ImageFigures{PSNR: psnr, SSIM: ssim, LatentMaxDiff: math.NaN()}
		if psnr < in.MinPSNR || ssim < in.MinSSIM {
			problems = append(problems, fmt.Sprintf("case %q: PSNR %.2f dB, SSIM %.4f against diffusers' pixels (want >= %.1f dB and >= %.3f)", c.Name, psnr, ssim, in.MinPSNR, in.MinSSIM))
		}
		if withLatents {
			d, problem := latentDiff(ctx, in, c, ans.PNG)
			f.LatentMaxDiff = d
			if problem != "" {
				problems = append(problems, fmt.Sprintf("case %q: %s", c.Name, problem))
			}
		}
		figs[c.Name] = f
	}
	if len(problems) > 0 {
		return figs, fmt.Errorf("image parity: %s", strings.Join(problems, "; "))
	}
	return figs, nil
}

// latentDiff compares the served final latents of case c with diffusers' last step.
func latentDiff(ctx context.Context, in ImageInput, c ImageGoldenCase, served []byte) (float64, string) {
	if len(c.StepsLatents) == 0 {
		if in.MaxLatentDiff == 0 {
			return math.NaN(), "" // reported where the golden has latents; nothing to report here
		}
		return math.NaN(), "the golden holds no steps_latents"
	}
	raw, err := base64.StdEncoding.DecodeString(c.StepsLatents[len(c.StepsLatents)-1].Latents)
	if err != nil {
		return math.NaN(), fmt.Sprintf("golden latents: %v", err)
	}
	want := decodeF32LE(raw)
	got, shape, sum, err := in.API.ImageLatents(ctx, c.Body(in.API.Model))
	if err != nil {
		return math.NaN(), err.Error()
	}
	if s := sha256.Sum256(served); sum != hex.EncodeToString(s[:]) {
		return math.NaN(), "the latents' run made another PNG than the served one (sha256 differs): they do not describe the served image"
	}
	if len(got) != len(want) {
		return math.NaN(), fmt.Sprintf("served latents of shape %v (%d values), diffusers' %v (%d)", shape, len(got), c.LatentShape, len(want))
	}
	d := 0.0
	for i := range got {
		d = math.Max(d, math.Abs(float64(got[i])-float64(want[i])))
	}
	if in.MaxLatentDiff > 0 && !(d <= in.MaxLatentDiff) {
		return d, fmt.Sprintf("final latents max|diff| %.3g against diffusers' (want <= %g)", d, in.MaxLatentDiff)
	}
	return d, ""
}

// NativePNG runs `qual generate-image` on the bundle (on device; empty: its default, cpu) and
// returns the PNG it wrote.
func NativePNG(ctx context.Context, qualBin, bundlePath, device string, r ImageRequest) ([]byte, error) {
	dir, err := os.MkdirTemp("", "mq-native-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "x.png")
	cmd := exec.CommandContext(ctx, qualBin, "generate-image", "--bundle", bundlePath, "--prompt", r.Prompt,
		"--size", fmt.Sprintf("%dx%d", r.Width, r.Height), "--steps", strconv.Itoa(r.Steps),
		"--guidance", strconv.FormatFloat(r.Guidance, 'g', -1, 64), "--seed", strconv.FormatInt(r.Seed, 10), "--out", out)
	if device != "" {
		cmd.Args = append(cmd.Args, "--device", device)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qual generate-image: %w\n%s", err, b)
	}
	return os.ReadFile(out)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// CheckImageNative: for every golden case's controls, the served PNG's sha256 equals the one
// `qual generate-image` writes for the same controls.
func CheckImageNative(ctx context.Context, in ImageInput) error {
	for _, c := range in.Golden {
		ans, err := in.API.GenerateImage(ctx, c.Body(in.API.Model))
		if err != nil {
			return fmt.Errorf("served vs native: case %q: %w", c.Name, err)
		}
		nat, err := NativePNG(ctx, in.QualBin, in.Bundle, in.Device, c.ImageRequest)
		if err != nil {
			return fmt.Errorf("served vs native: case %q: %w", c.Name, err)
		}
		if sha(ans.PNG) != sha(nat) {
			return fmt.Errorf("served vs native: case %q: served PNG sha256 %s (%d bytes) differs from qual generate-image's %s (%d bytes)", c.Name, sha(ans.PNG), len(ans.PNG), sha(nat), len(nat))
		}
	}
	return nil
}

// CheckImageControls: the same request twice gives the same bytes; another seed, another step
// count and another guidance each give another image (a server ignoring a control fails).
func CheckImageControls(ctx context.Context, in ImageInput) error {
	base := in.Golden[0].ImageRequest
	get := func(r ImageRequest) (string, error) {
		ans, err := in.API.GenerateImage(ctx, r.Body(in.API.Model))
		if err != nil {
			return "", err
		}
		return sha(ans.PNG), nil
	}
	a, err := get(base)
	if err != nil {
		return fmt.Errorf("controls: %w", err)
	}
	b, err := get(base)
	if err != nil {
		return fmt.Errorf("controls: %w", err)
	}
	if a != b {
		return fmt.Errorf("controls: the same request gave two images (sha256 %s, then %s)", a, b)
	}
	for _, v := range []struct {
		field string
		mod   func(*ImageRequest)
	}{
		{"seed", func(r *ImageRequest) { r.Seed++ }},
		{"num_inference_steps", func(r *ImageRequest) { r.Steps++ }},
		{"guidance_scale", func(r *ImageRequest) { r.Guidance += 1.5 }},
	} {
		r := base
		v.mod(&r)
		c, err := get(r)
		if err != nil {
			return fmt.Errorf("controls: %s changed: %w", v.field, err)
		}
		if c == a {
			return fmt.Errorf("controls: changing %s gave the same image (sha256 %s): the control is ignored", v.field, a)
		}
	}
	return nil
}

// Refusal is a request an image route must refuse, and the field its 400 must name.
type Refusal struct {
	Field string
	Body  map[string]any
}

// imageRefusals are the requests the contract refuses, each with the field the error must name.
func imageRefusals(base map[string]any, multiple int) []Refusal {
	with := func(k string, v any) map[string]any { return WithField(base, k, v) }
	return []Refusal{
		{"num_inference_steps", with("num_inference_steps", nil)},
		{"guidance_scale", with("guidance_scale", nil)},
		{"seed", with("seed", nil)},
		{"n", with("n", 2)},
		{"stream", with("stream", true)},
		{"response_format", with("response_format", "url")},
		{"quality", with("quality", "high")},
		{"style", with("style", "vivid")},
		{"background", with("background", "transparent")},
		{"output_format", with("output_format", "jpeg")},
		{"output_compression", with("output_compression", 50)},
		{"moderation", with("moderation", "low")},
		{"seconds", with("seconds", 4)},
		{"fps", with("fps", 24)},
		{"num_frames", with("num_frames", 16)},
		{"duration", with("duration", 2)},
		{"size", with("size", fmt.Sprintf("%dx%d", multiple+1, multiple))},
		{"size", with("size", "4096x4096")},
		{"num_inference_steps", with("num_inference_steps", 0)},
		{"num_inference_steps", with("num_inference_steps", 201)},
		{"guidance_scale", with("guidance_scale", "NaN")},
		{"seed", with("seed", -1)},
		{"seed", with("seed", json.Number("9223372036854775808"))},
		{"prompt", with("prompt", 7)},
		{"prompt", with("prompt", strings.Repeat("fox ", 600))},
	}
}

// CheckRefusals posts each refusal's body to /v1/images/generations, then base: each refusal
// must be answered 400 with the field as the error's param and in its message, and the valid
// request after it 200 (a refusal loses nothing). It returns one line per problem, naming the
// field and the value sent ("absent" for a field the body leaves out).
func CheckRefusals(ctx context.Context, api *API, base map[string]any, refusals []Refusal) []string {
	var problems []string
	for _, r := range refusals {
		val := "absent"
		if v, ok := r.Body[r.Field]; ok {
			val = fmt.Sprint(v)
			if len(val) > 40 {
				val = val[:40] + "..."
			}
		}
		_, err := api.GenerateImage(ctx, r.Body)
		var ae *APIError
		switch {
		case err == nil:
			problems = append(problems, fmt.Sprintf("%s %s: the request was answered 200, want 400", r.Field, val))
		case !errors.As(err, &ae):
			problems = append(problems, fmt.Sprintf("%s %s: %v", r.Field, val, err))
		case ae.Status != 400 || ae.Param != r.Field || !strings.Contains(ae.Message, r.Field):
			problems = append(problems, fmt.Sprintf("%s %s: HTTP %d param %q %q, want 400 naming %s", r.Field, val, ae.Status, ae.Param, ae.Message, r.Field))
		}
		if _, err := api.GenerateImage(ctx, base); err != nil {
			problems = append(problems, fmt.Sprintf("the valid request after the %s refusal failed: %v", r.Field, err))
		}
	}
	return problems
}

// CheckImageContract: every refused request gets 400 naming its field, and the next valid
// request gets 200.
func CheckImageContract(ctx context.Context, in ImageInput) error {
	base := in.Golden[0].Body(in.API.Model)
	problems := CheckRefusals(ctx, in.API, base, imageRefusals(base, in.SizeMultiple))
	// A text route on a text-to-image model is a client error naming the model, not a 5xx.
	_, err := in.API.Complete(ctx, "/v1/completions", map[string]any{"model": in.API.Model, "prompt": "a fox", "max_tokens": 4})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "model" {
		problems = append(problems, fmt.Sprintf("/v1/completions on an image model: %v, want 400 naming model", err))
	}
	if _, err := in.API.GenerateImage(ctx, base); err != nil {
		problems = append(problems, fmt.Sprintf("the valid request after the text-route refusal failed: %v", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("image contract: %s", strings.Join(problems, "; "))
	}
	return nil
}

// CheckImageGeometry: a non-square request gives exactly one RGB PNG of the asked size.
func CheckImageGeometry(ctx context.Context, in ImageInput) error {
	r := in.Golden[0].ImageRequest
	r.Width, r.Height = 3*in.SizeMultiple, 2*in.SizeMultiple
	ans, err := in.API.GenerateImage(ctx, r.Body(in.API.Model))
	if err != nil {
		return fmt.Errorf("geometry: %w", err)
	}
	if ans.Images != 1 {
		return fmt.Errorf("geometry: %d images in the response, want exactly 1", ans.Images)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(ans.PNG))
	if err != nil {
		return fmt.Errorf("geometry: the image is not a PNG: %w", err)
	}
	if cfg.Width != r.Width || cfg.Height != r.Height {
		return fmt.Errorf("geometry: the PNG is %dx%d, asked %dx%d", cfg.Width, cfg.Height, r.Width, r.Height)
	}
	// Go's decoder answers *image.RGBA for 8-bit RGB (colour type 2) only.
	if m, err := png.Decode(bytes.NewReader(ans.PNG)); err != nil {
		return fmt.Errorf("geometry: %w", err)
	} else if _, ok := m.(*image.RGBA); !ok {
		return fmt.Errorf("geometry: the PNG decodes to %T, want 8-bit RGB", m)
	}
	return nil
}

// ImageInput is the image gates' input for this suite: the golden of the manifest's fixture,
// the suite's bundle and qual binary; the family sets the thresholds and the size grid.
func (s *Suite) ImageInput() ImageInput {
	fixture := s.Manifest.Checkpoint.Fixture
	if fixture == "" {
		fixture = filepath.Base(s.Manifest.Checkpoint.ID)
	}
	golden, err := LoadImageGolden(filepath.Join(s.State.RepoRoot, "fixtures", "golden", fixture+".json"))
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return ImageInput{API: s.API, Golden: golden, Bundle: s.State.Bundle, Device: s.State.Device, QualBin: s.QualBin()}
}

// QualBin is the qual binary the suite built (for `qual generate-image`), for a family that
// assembles its own ImageInput.
func (s *Suite) QualBin() string { return filepath.Join(binDir(s.State.RepoRoot), "qual") }

// ImageGates declares the image gates with their labels (family files call it in Qualify).
func ImageGates(ctx context.Context, input func() ImageInput) {
	labels := func(g string) ginkgo.Labels { return append(Task(TaskImage), Gate(g)...) }
	ginkgo.It("serves images within PSNR and SSIM of diffusers' on the golden cases", labels(GateParity), func(sctx ginkgo.SpecContext) {
		figs, err := CheckImageParity(sctx, input())
		for name, f := range figs {
			ginkgo.AddReportEntry("image parity "+name, f.String())
		}
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	})
	ginkgo.It("serves the PNG bytes qual generate-image writes", labels(GateParity), func(sctx ginkgo.SpecContext) {
		in := input()
		if in.Bundle == "" {
			ginkgo.Skip("no local bundle to run qual generate-image on (external server)")
		}
		gomega.Expect(CheckImageNative(sctx, in)).To(gomega.Succeed())
	})
	ginkgo.It("is deterministic and follows seed, steps and guidance", labels(GateContract), func(sctx ginkgo.SpecContext) {
		gomega.Expect(CheckImageControls(sctx, input())).To(gomega.Succeed())
	})
	ginkgo.It("refuses unsupported and missing controls with 400 naming the field, then serves 200", labels(GateContract), func(sctx ginkgo.SpecContext) {
		gomega.Expect(CheckImageContract(sctx, input())).To(gomega.Succeed())
	})
	ginkgo.It("answers exactly one RGB PNG of the asked non-square size", labels(GateContract), func(sctx ginkgo.SpecContext) {
		gomega.Expect(CheckImageGeometry(sctx, input())).To(gomega.Succeed())
	})
	_ = ctx
}

// WithField is a copy of body with field k set to v, or removed when v is nil: one request of
// a refusal contract, each differing from a valid one in a single field.
func WithField(body map[string]any, k string, v any) map[string]any {
	m := make(map[string]any, len(body))
	for a, b := range body {
		m[a] = b
	}
	if v == nil {
		delete(m, k)
	} else {
		m[k] = v
	}
	return m
}
