package server

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native"
	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/tokenizer"
	"github.com/modelqual/modelqual/server/wire"
)

// imageTestServer is just enough of a Server for parseImageRequest: the Qwen3 tokenizer (with
// its chat template), the prompt rule the zimage family declares for zimage-tiny, a 512-token
// text-encoder context and the zimage size grid.
func imageTestServer(t testing.TB) (*Server, imageGeometry) {
	tok, err := tokenizer.Load(filepath.Join("..", "fixtures", "tokenizers", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	path, err := fixtures.Bundle("", fixtures.ZImageTiny)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rule, err := native.ImagePromptFor(b.Header().Family, b.Header().Config)
	if err != nil {
		t.Fatal(err)
	}
	return &Server{cfg: Config{ModelName: "zimage"}, tok: tok, imagePrompt: rule, info: wire.Info{MaxContext: 512}},
		imageGeometry{task: "image", multiple: 16, max: 2048, negativePrompt: true}
}

// TestImageRequestRefusals: each refusal is a 400 whose param and message name the field; a
// valid request parses to the prompt's chat-formatted ids (as diffusers' golden has them).
func TestImageRequestRefusals(t *testing.T) {
	s, g := imageTestServer(t)
	valid := `"prompt":"a red fox in the snow","size":"64x64","num_inference_steps":4,"guidance_scale":3.5,"seed":42`
	r, _, aerr := s.parseImageRequest([]byte("{"+valid+"}"), g)
	if aerr != nil {
		t.Fatal(aerr)
	}
	want := []int32{151644, 872, 198, 64, 2518, 38835, 304, 279, 11794, 151645, 198, 151644, 77091, 198} // fixtures/golden/zimage-tiny.json
	if len(r.Prompt) != len(want) || r.Width != 64 || r.Steps != 4 || r.Guidance != 3.5 || r.Seed != 42 {
		t.Fatalf("parsed %+v", r)
	}
	for i := range want {
		if r.Prompt[i] != want[i] {
			t.Fatalf("prompt ids %v, want diffusers' %v", r.Prompt, want)
		}
	}
	for field, body := range map[string]string{
		"seed":                `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1}`,
		"num_inference_steps": `{"prompt":"x","size":"64x64","num_inference_steps":201,"guidance_scale":1,"seed":1}`,
		"guidance_scale":      `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":"inf","seed":1}`,
		"size":                `{"prompt":"x","size":"64x65","num_inference_steps":4,"guidance_scale":1,"seed":1}`,
		"n":                   `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1,"n":3}`,
		"response_format":     `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1,"response_format":"url"}`,
		"fps":                 `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1,"fps":24}`,
		"prompt":              `{"prompt":"` + strings.Repeat("fox ", 600) + `","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1}`,
		"negative_prompt":     `{"prompt":"x","negative_prompt":3,"size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1}`,
		"model":               `{"model":"other","prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1}`,
		"bogus":               `{"prompt":"x","size":"64x64","num_inference_steps":4,"guidance_scale":1,"seed":1,"bogus":1}`,
	} {
		_, _, aerr := s.parseImageRequest([]byte(body), g)
		if aerr == nil || aerr.Status/100 != 4 || aerr.Param != field || !strings.Contains(aerr.Message, field) {
			t.Errorf("%s: got %+v, want a 4xx naming %s", field, aerr, field)
		}
	}
}

// FuzzImageRequest: the parser never panics; it accepts only requests within the grid and the
// control ranges, and refuses with a 4xx JSON error otherwise. Seeds: testdata/fuzz/FuzzImageRequest.
func FuzzImageRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"a fox","size":"64x64","num_inference_steps":4,"guidance_scale":3.5,"seed":42}`,
		`{"prompt":"a fox","size":"96x64","num_inference_steps":1,"guidance_scale":0,"seed":0,"n":1,"response_format":"b64_json"}`,
		`{"prompt":"","size":"16x2048","num_inference_steps":200,"guidance_scale":1e38,"seed":9223372036854775807}`,
		`{"prompt":"x","size":"0x0","num_inference_steps":-1,"guidance_scale":-1,"seed":-1}`, `[]`, `{`, `null`,
		`{"prompt":"x","size":"64x64","num_inference_steps":4.5,"guidance_scale":1e999,"seed":1.5}`,
	} {
		f.Add([]byte(s))
	}
	s, g := imageTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, _, aerr := s.parseImageRequest(body, g)
		if aerr != nil {
			if aerr.Status < 400 || aerr.Status > 499 || aerr.Message == "" || !json.Valid(aerr.body()) {
				t.Fatalf("bad error %+v", aerr)
			}
			return
		}
		if r.Width%16 != 0 || r.Height%16 != 0 || r.Width <= 0 || r.Height <= 0 || r.Width > 2048 || r.Height > 2048 ||
			r.Steps < 1 || r.Steps > imageMaxSteps || r.Guidance < 0 || len(r.Prompt) == 0 || len(r.Prompt) > 512 || len(r.Negative) == 0 {
			t.Fatalf("accepted out-of-range request %+v", r)
		}
	})
}
