package server_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// TestImageBundleRoutes runs the zimage-tiny bundle: /mq/v1/image_latents answers the final
// latents of the same generation /v1/images/generations serves (its png_sha256 is the served
// PNG's), every text route answers 400 naming the route to use instead, and the next image
// request answers 200.
func TestImageBundleRoutes(t *testing.T) {
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.ZImageTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, p, "--workers", "1", "--threads", "2")
	gen := `{"model": "test-model", "prompt": "a red fox in the snow", "size": "64x64", "num_inference_steps": 2, "guidance_scale": 3.5, "seed": 42}`
	code, _, body := s.post("/v1/images/generations", gen)
	var img struct {
		Data []struct {
			B64 string `json:"b64_json"`
		} `json:"data"`
	}
	if code != 200 || json.Unmarshal(body, &img) != nil || len(img.Data) != 1 {
		t.Fatalf("/v1/images/generations: %d %.300s", code, body)
	}
	png, _ := base64.StdEncoding.DecodeString(img.Data[0].B64)
	sum := sha256.Sum256(png)
	code, _, body = s.post("/mq/v1/image_latents", gen)
	var lat struct {
		Shape     []int  `json:"latent_shape"`
		DType     string `json:"dtype"`
		Data      string `json:"data"`
		PNGSHA256 string `json:"png_sha256"`
	}
	if code != 200 || json.Unmarshal(body, &lat) != nil {
		t.Fatalf("/mq/v1/image_latents: %d %.300s", code, body)
	}
	raw, err := base64.StdEncoding.DecodeString(lat.Data)
	if err != nil || lat.DType != "float32" || len(lat.Shape) != 3 || lat.Shape[1] != 8 || lat.Shape[2] != 8 || len(raw) != 4*lat.Shape[0]*64 {
		t.Fatalf("latents: dtype %q shape %v, %d bytes, %v", lat.DType, lat.Shape, len(raw), err)
	}
	if lat.PNGSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("the latents' run made PNG %s, the served one is %x", lat.PNGSHA256, sum)
	}
	if code, _, body = s.post("/mq/v1/image_latents", strings.Replace(gen, `"seed": 42`, `"seed": -1`, 1)); code != 400 || !strings.Contains(string(body), "seed") {
		t.Errorf("a bad seed on /mq/v1/image_latents: %d %s", code, body)
	}
	for _, c := range []struct{ route, body string }{
		{"/v1/completions", `{"model": "test-model", "prompt": "hi", "max_tokens": 2}`},
		{"/v1/chat/completions", `{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`},
		{"/mq/v1/logits", `{"model": "test-model", "prompt_token_ids": [1, 2]}`},
	} {
		code, _, body := s.post(c.route, c.body)
		if code != 400 || !strings.Contains(string(body), "/v1/images/generations") {
			t.Errorf("%s on an image bundle: %d %s; want 400 naming /v1/images/generations", c.route, code, body)
		}
	}
	if code, _, body = s.post("/v1/images/generations", gen); code != 200 {
		t.Errorf("the next image request: %d %.200s", code, body)
	}
}

// TestFluxImageRoutes runs both FLUX.1 variants' fixtures: dev requires guidance_scale (its
// guidance embedding), schnell takes it absent or 0 and refuses any other value, each refusal a
// 400 naming the field with the next request answered 200; true_cfg_scale with a negative prompt
// changes dev's image (real CFG), and without one is the same image as none (diffusers guides
// only with a negative prompt); a prompt beyond CLIP's 77 tokens is truncated, as the pipeline
// does, not refused; Z-Image refuses true_cfg_scale.
func TestFluxImageRoutes(t *testing.T) {
	image := func(s *testServer, body string) (int, string, string) {
		t.Helper()
		code, _, b := s.post("/v1/images/generations", body)
		var img struct {
			Data []struct {
				B64 string `json:"b64_json"`
			} `json:"data"`
		}
		if code != 200 {
			return code, "", string(b)
		}
		if json.Unmarshal(b, &img) != nil || len(img.Data) != 1 {
			t.Fatalf("/v1/images/generations: %d %.300s", code, b)
		}
		sum := sha256.Sum256([]byte(img.Data[0].B64))
		return code, hex.EncodeToString(sum[:]), string(b)
	}
	refused := func(s *testServer, body, field, next string) {
		t.Helper()
		if code, _, b := image(s, body); code != 400 || !strings.Contains(b, `"param":"`+field+`"`) {
			t.Errorf("%s: %d %.300s; want 400 naming %s", body, code, b, field)
		}
		if code, _, b := image(s, next); code != 200 {
			t.Errorf("the request after the %s refusal: %d %.300s", field, code, b)
		}
	}
	open := func(name string) *testServer {
		bundleMu.Lock()
		p, err := fixtures.Bundle(cacheDir, name)
		bundleMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		return startServer(t, p, "--workers", "1", "--threads", "2")
	}
	const base = `{"model": "test-model", "prompt": "a red fox in the snow", "size": "64x64", "num_inference_steps": 2, "seed": 42`

	dev := open(fixtures.FluxTinyDev)
	devOK := base + `, "guidance_scale": 3.5}`
	_, a, _ := image(dev, devOK)
	refused(dev, base+`}`, "guidance_scale", devOK)
	refused(dev, base+`, "guidance_scale": 3.5, "true_cfg_scale": -1}`, "true_cfg_scale", devOK)
	if _, b, _ := image(dev, base+`, "guidance_scale": 4.5}`); b == a {
		t.Error("dev: another guidance_scale gave the same image")
	}
	if _, b, _ := image(dev, base+`, "guidance_scale": 3.5, "true_cfg_scale": 2}`); b != a {
		t.Error("dev: true_cfg_scale without a negative prompt changed the image (diffusers runs no CFG then)")
	}
	if _, b, _ := image(dev, base+`, "guidance_scale": 3.5, "true_cfg_scale": 2, "negative_prompt": "blurry"}`); b == a || b == "" {
		t.Error("dev: true_cfg_scale 2 with a negative prompt gave the same image (or none)")
	}
	if code, _, b := image(dev, strings.Replace(devOK, "a red fox in the snow", strings.Repeat("fox ", 600), 1)); code != 200 {
		t.Errorf("dev: a prompt beyond 77 CLIP tokens: %d %.300s; want 200 (truncated as the pipeline does)", code, b)
	}

	schnell := open(fixtures.FluxTinySchnell)
	_, s0, _ := image(schnell, base+`}`)
	if _, s1, _ := image(schnell, base+`, "guidance_scale": 0}`); s1 != s0 || s0 == "" {
		t.Error("schnell: guidance_scale 0 and guidance_scale absent gave different images")
	}
	refused(schnell, base+`, "guidance_scale": 3.5}`, "guidance_scale", base+`}`)

	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.ZImageTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	z := startServer(t, p, "--workers", "1", "--threads", "2")
	refused(z, base+`, "guidance_scale": 3.5, "true_cfg_scale": 2}`, "true_cfg_scale", base+`, "guidance_scale": 3.5}`)
}
