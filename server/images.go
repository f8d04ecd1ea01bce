package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/server/record"
	"github.com/modelqual/modelqual/server/wire"
)

// Text-to-image serving: POST /v1/images/generations in OpenAI's image API shape (model,
// prompt, size, n, response_format) plus the controls a diffusion workload is measured by:
// num_inference_steps, guidance_scale and seed, all three required, since a request must say
// what workload it is. What the pipeline cannot honour is refused with 400 naming the field,
// never silently ignored. The worker runs the pipeline and encodes the PNG with the encoder
// `qual generate-image` uses, so the same controls give the same bytes on both paths.

// imageMaxSteps bounds num_inference_steps.
const imageMaxSteps = 200

// imageRefused are OpenAI (and video-API) fields this route never honours, with why.
var imageRefused = []struct{ field, why string }{
	{"stream", "streaming partial images is not supported; omit `stream`"},
	{"quality", "`quality` is not a control of this pipeline; set num_inference_steps and guidance_scale instead"},
	{"style", "`style` is not a control of this pipeline; describe the style in the prompt"},
	{"background", "`background` is not supported: the pipeline draws opaque RGB images"},
	{"output_compression", "`output_compression` is not supported: the output is a lossless PNG"},
	{"moderation", "`moderation` is not supported by this server"},
	{"seconds", "`seconds` is a video field; this model generates still images"},
	{"fps", "`fps` is a video field; this model generates still images"},
	{"num_frames", "`num_frames` is a video field; this model generates still images"},
	{"duration", "`duration` is a video field; this model generates still images"},
}

// imageGeometry is what the frontend knows of the pipeline from the bundle's config: sizes
// must be multiples of the VAE's scale times the transformer's 2x2 patch, up to the
// transformer's position table (and 2048), as the native pipeline checks again.
type imageGeometry struct {
	task           string
	multiple, max  int
	negativePrompt bool
}

// imageGeometryOf reads it from the bundle header once, when the bundle is verified.
func imageGeometryOf(header []byte) imageGeometry {
	var h struct {
		Task   string `json:"task"`
		Config struct {
			VAE struct {
				BlockOut []int `json:"block_out_channels"`
			} `json:"vae"`
			Transformer struct {
				AxesLens []int `json:"axes_lens"`
			} `json:"transformer"`
		} `json:"config"`
	}
	_ = json.Unmarshal(header, &h)
	g := imageGeometry{task: h.Task, negativePrompt: true}
	if n := len(h.Config.VAE.BlockOut); n > 0 {
		g.multiple = (1 << (n - 1)) * 2
		g.max = 2048
		if a := h.Config.Transformer.AxesLens; len(a) == 3 {
			g.max = min(g.max, min(a[1], a[2])*g.multiple)
		}
	}
	return g
}

// parseImageSize reads "WxH".
func parseImageSize(v string) (int, int, bool) {
	ws, hs, ok := strings.Cut(v, "x")
	w, e1 := strconv.Atoi(ws)
	h, e2 := strconv.Atoi(hs)
	return w, h, ok && e1 == nil && e2 == nil && w > 0 && h > 0
}

// imageRoute is /v1/images/generations and, with latents, /mq/v1/image_latents: the same
// request, validation and pipeline, answered with the final latents (before the VAE) as float32
// beside the PNG's sha256, so a gate can hold a served model's latents to diffusers' through
// HTTP (the parity gate's latent max|diff|). These are its parts of the request lifecycle
// (server.go's serve).
type imageRoute struct {
	s       *Server
	latents bool
	req     wire.ImageRequest
}

// decode parses and validates the body, tokenizing the prompts on the way (parseImageRequest's
// order of refusals), once the bundle is known to draw images.
func (r *imageRoute) decode(q *reqState, body []byte) *APIError {
	s := r.s
	if v := q.r.Header.Get("X-Warmup"); v == "1" || v == "true" {
		q.rec.Warmup = true
	}
	g := s.image
	if g.task != "image" {
		return badRequest("model", "model %q serves task %q; /v1/images/generations needs a text-to-image model", s.cfg.ModelName, g.task)
	}
	req, prompt, aerr := s.parseImageRequest(body, g)
	if aerr != nil {
		return aerr
	}
	q.rec.InputTokens = len(req.Prompt)
	q.rec.PromptSHA256, q.rec.PromptBytes = sha256Hex([]byte(prompt)), int64(len(prompt))
	r.req = req
	return nil
}

// prepare is the pipeline's task: the prompts were tokenized by decode.
func (r *imageRoute) prepare(q *reqState) (*task, *APIError) {
	req := &r.req
	q.rec.Image = &record.ImageGen{Width: req.Width, Height: req.Height, Steps: req.Steps, Guidance: float64(req.Guidance), Seed: int64(req.Seed)}
	req.Latents = r.latents
	t := r.s.pool.newTask()
	t.prompt, t.image = req.Prompt, req
	return t, nil
}

// context is the client's: an image is not cut by the drain or --request-timeout.
func (r *imageRoute) context(q *reqState) (context.Context, func()) {
	return q.r.Context(), func() {}
}

// run waits for the pipeline and answers with the PNG (or the latents).
func (r *imageRoute) run(q *reqState, t *task, ctx context.Context) {
	req, latents := &r.req, r.latents
	for {
		t.mu.Lock()
		done := t.done
		t.mu.Unlock()
		if done {
			break
		}
		select {
		case <-t.notify:
		case <-ctx.Done():
			q.failContext(ctx) // the worker finishes the image anyway; its slot frees itself then
			return
		}
	}
	if t.fail != nil {
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "worker_crashed", Message: t.fail.Error()})
		return
	}
	t.mu.Lock()
	a := t.imgRes
	t.mu.Unlock()
	if t.res.Reason == wire.ReasonError {
		q.fail(&APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "engine_error", Message: "image generation failed: " + t.res.Message})
		return
	}
	q.rec.TaskWallNs = a.PipelineNs
	q.rec.OutputSHA256, q.rec.OutputBytes = sha256Hex(a.PNG), int64(len(a.PNG))
	q.rec.Image.PNGSHA256, q.rec.Image.PNGBytes, q.rec.Image.PNGEncodeNs = q.rec.OutputSHA256, q.rec.OutputBytes, a.EncodeNs
	q.rec.FinishReason = "stop"
	if latents {
		if len(a.LatentShape) != 3 || len(a.Latents) != a.LatentShape[0]*a.LatentShape[1]*a.LatentShape[2] {
			q.fail(&APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "engine_error", Message: "the worker returned no latents"})
			return
		}
		raw := make([]byte, 4*len(a.Latents))
		for i, v := range a.Latents {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		q.writeJSON(http.StatusOK, map[string]any{"object": "image_latents", "latent_shape": a.LatentShape,
			"dtype": "float32", "encoding": "base64", "data": base64.StdEncoding.EncodeToString(raw), "png_sha256": q.rec.OutputSHA256})
		return
	}
	b := make([]byte, 0, 96+base64.StdEncoding.EncodedLen(len(a.PNG)))
	b = append(b, `{"created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"output_format":"png","size":"`...)
	b = strconv.AppendInt(b, int64(req.Width), 10)
	b = append(b, 'x')
	b = strconv.AppendInt(b, int64(req.Height), 10)
	b = append(b, `","data":[{"b64_json":"`...)
	b = base64.StdEncoding.AppendEncode(b, a.PNG)
	b = append(b, `"}]}`...)
	q.status = http.StatusOK
	q.w.Header().Set("Content-Type", "application/json")
	q.w.WriteHeader(http.StatusOK)
	_, _ = q.w.Write(b)
}

// parseImageRequest validates the body; every refusal names its field.
func (s *Server) parseImageRequest(body []byte, g imageGeometry) (wire.ImageRequest, string, *APIError) {
	var r wire.ImageRequest
	var raw map[string]json.RawMessage
	if t := strings.TrimSpace(string(body)); t == "" || t[0] != '{' || json.Unmarshal(body, &raw) != nil {
		return r, "", badRequest("", "request body must be a JSON object")
	}
	for _, f := range imageRefused {
		if _, ok := raw[f.field]; ok {
			return r, "", badRequest(f.field, "%s", f.why)
		}
	}
	m, aerr := decodeObject(body, "model", "prompt", "negative_prompt", "size", "n", "response_format", "output_format",
		"num_inference_steps", "guidance_scale", "true_cfg_scale", "seed", "user")
	if aerr != nil {
		aerr.Message += "; this route takes model, prompt, negative_prompt, size, n, response_format, output_format, num_inference_steps, guidance_scale, true_cfg_scale (models that have it), seed, user"
		return r, "", aerr
	}
	rule := s.imagePrompt
	if v, ok := m["true_cfg_scale"]; ok && !isNull(v) {
		if !rule.TrueCFG {
			return r, "", badRequest("true_cfg_scale", "`true_cfg_scale` is not a control of this model; guidance_scale is its classifier-free guidance")
		}
		var tc float64
		if json.Unmarshal(v, &tc) != nil || math.IsNaN(tc) || math.IsInf(tc, 0) || tc < 0 || tc > math.MaxFloat32 {
			return r, "", badRequest("true_cfg_scale", "`true_cfg_scale` must be a finite number >= 0 (above 1 with a negative_prompt: real classifier-free guidance)")
		}
		r.TrueCFG = float32(tc)
	}
	if aerr := s.checkModel(m); aerr != nil {
		return r, "", aerr
	}
	if v, ok := m["n"]; ok && !isNull(v) {
		var n float64
		if json.Unmarshal(v, &n) != nil || n != 1 {
			return r, "", badRequest("n", "`n` must be 1: one image per request (send several requests for more)")
		}
	}
	if v, ok := m["response_format"]; ok {
		f, aerr := str(v, "response_format")
		if aerr != nil {
			return r, "", aerr
		}
		if f != "" && f != "b64_json" {
			return r, "", badRequest("response_format", "`response_format` %q is not supported: only b64_json (this server keeps no files to link to)", f)
		}
	}
	if v, ok := m["output_format"]; ok {
		f, aerr := str(v, "output_format")
		if aerr != nil {
			return r, "", aerr
		}
		if f != "" && f != "png" {
			return r, "", badRequest("output_format", "`output_format` %q is not supported: only png", f)
		}
	}
	// prompt and negative_prompt: strings within the text encoder's context once formatted.
	pv, ok := m["prompt"]
	if !ok || isNull(pv) {
		return r, "", badRequest("prompt", "`prompt` is required: the text to draw")
	}
	var prompt string
	if json.Unmarshal(pv, &prompt) != nil {
		return r, "", badRequest("prompt", "`prompt` must be a string")
	}
	var err error
	if r.Prompt, err = rule.IDs(s.tok, prompt); err != nil {
		return r, "", badRequest("prompt", "%v", err)
	}
	if rule.Second != nil {
		if r.Prompt2, err = rule.Second.IDs(s.tok2, prompt); err != nil {
			return r, "", badRequest("prompt", "%v", err)
		}
	}
	if len(r.Prompt) > s.info.MaxContext {
		e := badRequest("prompt", "`prompt` is %d tokens once formatted, beyond the text encoder's context of %d", len(r.Prompt), s.info.MaxContext)
		e.Code = "context_length_exceeded"
		return r, "", e
	}
	negative := ""
	v, hasNegative := m["negative_prompt"]
	hasNegative = hasNegative && !isNull(v)
	if hasNegative {
		if !g.negativePrompt {
			return r, "", badRequest("negative_prompt", "this model takes no negative prompt")
		}
		if json.Unmarshal(v, &negative) != nil {
			return r, "", badRequest("negative_prompt", "`negative_prompt` must be a string")
		}
	}
	// A classifier-free-guidance pipeline always has a negative prompt ("" by default); a
	// true-CFG one (FLUX) guides only with one that was sent, as diffusers' has_neg_prompt.
	if !rule.TrueCFG || hasNegative {
		if r.Negative, err = rule.IDs(s.tok, negative); err != nil {
			return r, "", badRequest("negative_prompt", "%v", err)
		}
		if rule.Second != nil {
			if r.Negative2, err = rule.Second.IDs(s.tok2, negative); err != nil {
				return r, "", badRequest("negative_prompt", "%v", err)
			}
		}
	}
	if len(r.Negative) > s.info.MaxContext {
		return r, "", badRequest("negative_prompt", "`negative_prompt` is %d tokens once formatted, beyond the text encoder's context of %d", len(r.Negative), s.info.MaxContext)
	}
	// size.
	sv, ok := m["size"]
	if !ok || isNull(sv) {
		return r, "", badRequest("size", "`size` is required: \"WIDTHxHEIGHT\" in pixels, multiples of %d up to %d", g.multiple, g.max)
	}
	size, aerr := str(sv, "size")
	if aerr != nil {
		return r, "", aerr
	}
	w, h, ok := parseImageSize(size)
	if !ok {
		return r, "", badRequest("size", "`size` %q is not \"WIDTHxHEIGHT\" (e.g. \"512x512\")", size)
	}
	if w%g.multiple != 0 || h%g.multiple != 0 || w > g.max || h > g.max {
		return r, "", badRequest("size", "`size` %s is off this model's grid: width and height must be multiples of %d up to %d", size, g.multiple, g.max)
	}
	r.Width, r.Height = w, h
	// The three workload controls, required.
	stv, ok := m["num_inference_steps"]
	if !ok || isNull(stv) {
		return r, "", badRequest("num_inference_steps", "`num_inference_steps` is required: the number of denoising steps (1 to %d)", imageMaxSteps)
	}
	var steps float64
	if json.Unmarshal(stv, &steps) != nil || steps != math.Trunc(steps) || steps < 1 || steps > imageMaxSteps {
		return r, "", badRequest("num_inference_steps", "`num_inference_steps` must be an integer from 1 to %d", imageMaxSteps)
	}
	r.Steps = int(steps)
	gv, ok := m["guidance_scale"]
	if (!ok || isNull(gv)) && rule.GuidanceScale == native.GuidanceZero {
		gv, ok = json.RawMessage("0"), true // a checkpoint without guidance: absent is 0
	}
	if !ok || isNull(gv) {
		return r, "", badRequest("guidance_scale", "`guidance_scale` is required: the guidance scale (0 turns guidance off)")
	}
	var gs float64
	if json.Unmarshal(gv, &gs) != nil || math.IsNaN(gs) || math.IsInf(gs, 0) || gs > math.MaxFloat32 {
		return r, "", badRequest("guidance_scale", "`guidance_scale` must be a finite number")
	}
	if gs < 0 {
		return r, "", badRequest("guidance_scale", "`guidance_scale` %v is negative; use 0 to turn guidance off", gs)
	}
	if gs != 0 && rule.GuidanceScale == native.GuidanceZero {
		return r, "", badRequest("guidance_scale", "`guidance_scale` %v: this checkpoint has no guidance (a timestep-distilled model such as FLUX.1 schnell); send 0 or leave it out", gs)
	}
	r.Guidance = float32(gs)
	sdv, ok := m["seed"]
	if !ok || isNull(sdv) {
		return r, "", badRequest("seed", "`seed` is required: an integer from 0 to %d (torch.Generator(\"cpu\").manual_seed)", int64(math.MaxInt64))
	}
	seed, err := strconv.ParseInt(strings.TrimSpace(string(sdv)), 10, 64)
	if err != nil || seed < 0 {
		return r, "", badRequest("seed", "`seed` must be an integer from 0 to %d", int64(math.MaxInt64))
	}
	r.Seed = uint64(seed)
	return r, prompt, nil
}
