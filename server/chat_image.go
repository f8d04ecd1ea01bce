package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/record"
	"github.com/modelqual/modelqual/server/tokenizer"
	"github.com/modelqual/modelqual/server/vision"
	"github.com/modelqual/modelqual/server/wire"
)

// This file is the chat route's image side (vision-language bundles, task "vision"): content
// parts with images as data: URLs (one per request unless --max-images-per-request allows
// more), the processor (package vision), the placeholder expansion and the record's image
// fields. The refusals name their reason; nothing is fetched.

// maxImagePixels bounds an image's width x height as read from its header, before decoding: a
// small file that declares a huge image (a decompression bomb) is refused without allocating.
const maxImagePixels = 1 << 25

// ImagePart is the one image of a chat request, as the client sent it.
type ImagePart struct {
	Param string // where it was: messages[i].content[j]
	Mime  string // the data: URL's media type
	Data  []byte // the decoded base64 payload
}

// visionState is what a vision bundle adds to the server.
type visionState struct {
	proc       vision.Processor // the checkpoint's image processor, by image_processor_type
	imageToken int32
	// frame: the tokens around an image's placeholders (InternVL's <img> ... </img>); nil
	// when the processor has none (Qwen3-VL's template renders its own).
	frame []int32
	// ownGrids: several images go to the engine as a list, each on its own grid
	// (vision.OwnGrids); otherwise they stack into one grid (vision.Stacking).
	ownGrids bool
}

// newVisionState reads a vision bundle's image processor (its preprocessor_config.json section,
// read by section, names it in image_processor_type) and image token (config.json's
// image_token_id).
func newVisionState(config json.RawMessage, section func(string) ([]byte, error), tok *tokenizer.Tokenizer, maxImages int) (*visionState, error) {
	pc, err := section(bundle.SectionPreprocessorConfig)
	if err != nil {
		return nil, fmt.Errorf("%w (a vision bundle needs the checkpoint's preprocessor_config.json)", err)
	}
	proc, err := vision.NewProcessor(pc)
	if err != nil {
		return nil, err
	}
	_, stacks := proc.(vision.Stacking)
	_, own := proc.(vision.OwnGrids)
	if !stacks && !own && maxImages > 1 {
		return nil, fmt.Errorf("--max-images-per-request %d: this bundle's image processor takes one image per request (its engine has no positions for several images); use 1", maxImages)
	}
	if mc, ok := proc.(vision.ModelConfigured); ok {
		if err := mc.UseModelConfig(config); err != nil {
			return nil, err
		}
	}
	var c struct {
		ImageTokenID *int32 `json:"image_token_id"`
	}
	if err := json.Unmarshal(config, &c); err != nil || c.ImageTokenID == nil {
		return nil, fmt.Errorf("vision bundle: config.json has no image_token_id")
	}
	v := &visionState{proc: proc, imageToken: *c.ImageTokenID, ownGrids: own}
	if f, ok := proc.(vision.Framed); ok {
		start, end := f.Frame()
		for _, t := range []string{start, end} {
			id, ok := tok.SpecialID(t)
			if !ok {
				return nil, fmt.Errorf("vision bundle: the tokenizer has no added token %q, which the image processor puts around each image's tokens", t)
			}
			v.frame = append(v.frame, id)
		}
	}
	return v, nil
}

// decodeContentParts parses a message's list content: text parts and image parts (image_url
// with a data: URL). A message without an image gets its texts joined by newlines (as vLLM
// does); one with images keeps the parts for the chat template, which renders each image's
// placeholder. seen is how many images earlier messages had; maxImages bounds the request's
// images (--max-images-per-request, 0 counting as 1).
func decodeContentParts(p, role string, raw json.RawMessage, seen, maxImages int) (any, []*ImagePart, *APIError) {
	var parts []map[string]json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return nil, nil, badRequest(p+".content", "`%s.content` must be a string or a list of content parts ({\"type\": \"text\", \"text\": ...} or {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}})", p)
	}
	var texts []string
	var out []any
	var imgs []*ImagePart
	maxImages = max(maxImages, 1)
	for j, part := range parts {
		pp := fmt.Sprintf("%s.content[%d]", p, j)
		var typ string
		if json.Unmarshal(part["type"], &typ) != nil {
			return nil, nil, badRequest(pp+".type", "`%s.type` must be a string: text or image_url", pp)
		}
		switch typ {
		case "text":
			var text string
			if json.Unmarshal(part["text"], &text) != nil {
				return nil, nil, badRequest(pp+".text", "`%s.text` must be a string", pp)
			}
			texts = append(texts, text)
			out = append(out, map[string]any{"type": "text", "text": text})
		case "image_url":
			if role != "user" {
				return nil, nil, badRequest(pp, "an image in a %s message is not supported; send the image in a user message", role)
			}
			if n := seen + len(imgs); n >= maxImages {
				if maxImages == 1 {
					return nil, nil, badRequest(pp, "a second image; this server takes one image per request (--max-images-per-request 1)")
				}
				return nil, nil, badRequest(pp, "image %d of the request; this server takes at most %d images per request (--max-images-per-request)", n+1, maxImages)
			}
			im, aerr := decodeImageURL(pp, part["image_url"])
			if aerr != nil {
				return nil, nil, aerr
			}
			imgs = append(imgs, im)
			out = append(out, map[string]any{"type": "image"})
		case "input_audio", "audio", "audio_url", "video", "video_url", "file", "input_file":
			return nil, nil, badRequest(pp+".type", "`%s.type` %q is not supported; this model takes text and one image (image_url)", pp, typ)
		default:
			return nil, nil, badRequest(pp+".type", "`%s.type` %q is not supported; use text or image_url", pp, typ)
		}
	}
	if len(imgs) == 0 {
		return strings.Join(texts, "\n"), nil, nil
	}
	return out, imgs, nil
}

// decodeImageURL parses {"url": "data:<mime>;base64,<data>", "detail": "auto"}.
func decodeImageURL(pp string, raw json.RawMessage) (*ImagePart, *APIError) {
	var iu struct {
		URL    *string `json:"url"`
		Detail *string `json:"detail"`
	}
	if len(bytes.TrimSpace(raw)) == 0 || json.Unmarshal(raw, &iu) != nil || iu.URL == nil {
		return nil, badRequest(pp+".image_url", "`%s.image_url` must be an object with a \"url\" (a data: URL)", pp)
	}
	if iu.Detail != nil && *iu.Detail != "auto" {
		return nil, badRequest(pp+".image_url.detail", "`%s.image_url.detail` %q is not supported; only \"auto\" (the processor's own resize)", pp, *iu.Detail)
	}
	u := *iu.URL
	low := strings.ToLower(u)
	switch {
	case strings.HasPrefix(low, "http://"), strings.HasPrefix(low, "https://"), strings.HasPrefix(low, "file:"), strings.HasPrefix(low, "ftp://"):
		return nil, badRequest(pp+".image_url.url", "`%s.image_url.url` is a remote or file URL; this server fetches nothing: send the image inline as data:image/png;base64,... or data:image/jpeg;base64,...", pp)
	case !strings.HasPrefix(low, "data:"):
		return nil, badRequest(pp+".image_url.url", "`%s.image_url.url` must be a data: URL (data:image/png;base64,...)", pp)
	}
	head, data, ok := strings.Cut(u[len("data:"):], ",")
	if !ok || !strings.HasSuffix(strings.ToLower(head), ";base64") {
		return nil, badRequest(pp+".image_url.url", "`%s.image_url.url` must be a base64 data: URL (data:<media type>;base64,<data>)", pp)
	}
	mime := strings.ToLower(strings.TrimSuffix(strings.ToLower(head), ";base64"))
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, badRequest(pp+".image_url.url", "`%s.image_url.url`: the base64 data does not decode: %v", pp, err)
	}
	if len(b) == 0 {
		return nil, badRequest(pp+".image_url.url", "`%s.image_url.url` holds no image data", pp)
	}
	return &ImagePart{Param: pp + ".image_url.url", Mime: mime, Data: b}, nil
}

// prepareImage decodes and processes the request's images, expands each image's placeholder
// in ids (in order) to the processor's tokens (framed by its start and end tokens, when it has
// them), and fills the record's image fields. Several images go to the engine as one input:
// their tiles stacked (vision.Stacking), or a list of images each on its own grid
// (vision.OwnGrids); the server refuses to start with --max-images-per-request above 1 for a
// processor that does neither. A request
// without an image on a vision bundle, or any image on another bundle, is handled here too.
func (s *Server) prepareImage(q *reqState, req *GenRequest, ids []int32) ([]int32, *wire.ImageInput, *APIError) {
	v := s.vision
	if len(req.Images) == 0 {
		if v != nil {
			for _, t := range ids {
				if t == v.imageToken {
					return nil, nil, badRequest("messages", "the prompt holds the image placeholder token but no image part; send the image as an image_url content part")
				}
			}
		}
		return ids, nil, nil
	}
	if v == nil {
		return nil, nil, badRequest(req.Images[0].Param, "this model takes no images (its bundle's task is not vision)")
	}
	var at []int
	for i, t := range ids {
		if t == v.imageToken {
			at = append(at, i)
		}
	}
	switch {
	case len(at) == 0:
		return nil, nil, badRequest("messages", "the chat template rendered no image placeholder for the image part")
	case len(at) != len(req.Images):
		return nil, nil, badRequest("messages", "the rendered prompt holds %d image placeholders for %d images; remove image placeholder text from the messages", len(at), len(req.Images))
	}
	input := &wire.ImageInput{}
	out := make([]int32, 0, len(ids))
	last := 0
	var recs []record.VisionInput
	for k, part := range req.Images {
		start := time.Now()
		im, err := vision.Decode(part.Data, part.Mime, maxImagePixels)
		if err != nil {
			return nil, nil, badRequest(part.Param, "%v", err)
		}
		r, err := v.proc.Preprocess(im.RGB, im.Width, im.Height)
		if err != nil {
			return nil, nil, badRequest(part.Param, "%v", err)
		}
		out = append(out, ids[last:at[k]]...)
		last = at[k] + 1
		if v.frame != nil {
			out = append(out, v.frame[0])
		}
		for i := 0; i < r.Tokens; i++ {
			out = append(out, v.imageToken)
		}
		if v.frame != nil {
			out = append(out, v.frame[1])
		}
		g := [3]uint32{uint32(r.Grid[0]), uint32(r.Grid[1]), uint32(r.Grid[2])}
		switch {
		case k == 0:
			input.Grid, input.Pixels = g, r.Pixels
		case v.ownGrids:
			// Each image on its own grid (vision.OwnGrids): a list, pixels one after another.
			input.Pixels = append(input.Pixels, r.Pixels...)
		default:
			// Stacking processors (checked at start): same tile shape, tiles add up.
			input.Grid[0] += g[0]
			input.Pixels = append(input.Pixels, r.Pixels...)
		}
		if v.ownGrids && len(req.Images) > 1 {
			input.Grids = append(input.Grids, g)
		}
		recs = append(recs, record.VisionInput{
			BytesSHA256: im.BytesSHA256, PixelsSHA256: im.PixelsSHA256, Format: im.Format,
			OriginalWidth: im.Width, OriginalHeight: im.Height, ResizedWidth: r.ResizedWidth, ResizedHeight: r.ResizedHeight,
			Tiles: r.Tiles, ImageTokens: r.Tokens, PreprocessNs: time.Since(start).Nanoseconds(),
		})
	}
	out = append(out, ids[last:]...)
	q.rec.InputTokens = len(out)
	q.rec.Vision = &recs[0]
	if len(recs) > 1 {
		q.rec.VisionImages = recs
	}
	return out, input, nil
}
