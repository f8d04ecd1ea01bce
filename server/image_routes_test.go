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
