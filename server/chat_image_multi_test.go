package server_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
)

// The chat route with several images per request (--max-images-per-request): InternVL's images
// stack (their tiles one after another, each image's <img> ... </img> run where its content
// part stands); Qwen3-VL's keep their own grids (a list to the engine, each image's
// <|image_pad|> run where its content part stands).

func multiImageChat(urls []string, text string) string {
	var parts []any
	for _, u := range urls {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
	}
	parts = append(parts, map[string]any{"type": "text", "text": text})
	b, _ := json.Marshal(map[string]any{"model": "test-model", "max_tokens": 8, "temperature": 0, "ignore_eos": true,
		"messages": []any{map[string]any{"role": "user", "content": parts}}})
	return string(b)
}

type multiRecord struct {
	InputTokens int `json:"input_tokens"`
	Status      int `json:"status"`
	Vision      *struct {
		Tiles       int `json:"tiles"`
		ImageTokens int `json:"image_tokens"`
	} `json:"vision"`
	VisionImages []struct {
		BytesSHA256 string `json:"image_bytes_sha256"`
		Tiles       int    `json:"tiles"`
		ImageTokens int    `json:"image_tokens"`
	} `json:"vision_images"`
}

// TestVisionMultiImageInternVL: two images in one request are served, the record lists each
// image's tiles and tokens in order, swapping them changes the answer, and a third image is
// refused naming the flag.
func TestVisionMultiImageInternVL(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.InternVLTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, p, "--workers", "1", "--threads", "2", "--max-images-per-request", "2")
	square := dataURL(t, root, "fixtures/images/internvl/01-square-448x448.png") // 1 tile
	wide := dataURL(t, root, "fixtures/images/internvl/03-wide-1350x450.png")    // 3x1 + thumbnail
	var last [][]float32
	for _, urls := range [][]string{{square, wide}, {wide, square}} {
		code, _, body := s.post("/v1/chat/completions", multiImageChat(urls, "Compare the two images."))
		if code != 200 {
			t.Fatalf("two images: %d %s", code, body)
		}
		var m map[string]any
		_ = json.Unmarshal([]byte(multiImageChat(urls, "Compare the two images.")), &m)
		b, _ := json.Marshal(map[string]any{"model": "test-model", "messages": m["messages"]})
		code, _, body = s.post("/mq/v1/logits", string(b))
		var lg struct {
			Vocab     int    `json:"vocab_size"`
			Positions int    `json:"positions"`
			Data      string `json:"data"`
		}
		if code != 200 || json.Unmarshal(body, &lg) != nil {
			t.Fatalf("/mq/v1/logits with two images: %d %.300s", code, body)
		}
		raw, err := base64.StdEncoding.DecodeString(lg.Data)
		if err != nil {
			t.Fatal(err)
		}
		row := make([]float32, lg.Vocab)
		for i := range row {
			row[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*((lg.Positions-1)*lg.Vocab+i):]))
		}
		last = append(last, row)
	}
	d := 0.0
	for i := range last[0] {
		d = math.Max(d, math.Abs(float64(last[0][i]-last[1][i])))
	}
	if d < 1e-2 {
		t.Errorf("swapping the two images moves the last logits by only %.3g: image order does not reach the model", d)
	}
	code, _, body := s.post("/v1/chat/completions", multiImageChat([]string{square, square, wide}, "Three?"))
	if code != 400 || !strings.Contains(string(body), "--max-images-per-request") || !strings.Contains(string(body), "content[2]") {
		t.Errorf("three images with --max-images-per-request 2: %d %s; want 400 naming the flag and the third part", code, body)
	}
	b, err := os.ReadFile(s.records)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var r multiRecord
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 || len(r.VisionImages) != 2 || r.VisionImages[0].Tiles != 1 || r.VisionImages[1].Tiles != 4 ||
		r.VisionImages[0].ImageTokens != 64 || r.VisionImages[1].ImageTokens != 256 || r.Vision == nil || r.Vision.Tiles != 1 {
		t.Fatalf("record of the two-image request: %s", lines[0])
	}
	// The prompt holds both runs, each framed: 5 tiles' tokens and two <img> ... </img> pairs.
	if r.InputTokens < 5*64+4 {
		t.Errorf("input tokens %d, fewer than the two images' 324", r.InputTokens)
	}
}

// lastLogitsRow is /mq/v1/logits' last position for a chat body's messages.
func lastLogitsRow(t *testing.T, s *testServer, chat string) []float32 {
	t.Helper()
	var m map[string]any
	_ = json.Unmarshal([]byte(chat), &m)
	b, _ := json.Marshal(map[string]any{"model": "test-model", "messages": m["messages"]})
	code, _, body := s.post("/mq/v1/logits", string(b))
	var lg struct {
		Vocab     int    `json:"vocab_size"`
		Positions int    `json:"positions"`
		Data      string `json:"data"`
	}
	if code != 200 || json.Unmarshal(body, &lg) != nil {
		t.Fatalf("/mq/v1/logits: %d %.300s", code, body)
	}
	raw, err := base64.StdEncoding.DecodeString(lg.Data)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]float32, lg.Vocab)
	for i := range row {
		row[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*((lg.Positions-1)*lg.Vocab+i):]))
	}
	return row
}

// interleavedChat is a chat body whose user content alternates text and images as given (a
// string is a text part, anything else the next URL of urls).
func interleavedChat(urls []string, texts ...string) string {
	var parts []any
	for i, text := range texts {
		if text != "" {
			parts = append(parts, map[string]any{"type": "text", "text": text})
		}
		if i < len(urls) {
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": urls[i]}})
		}
	}
	b, _ := json.Marshal(map[string]any{"model": "test-model", "max_tokens": 8, "temperature": 0, "ignore_eos": true,
		"messages": []any{map[string]any{"role": "user", "content": parts}}})
	return string(b)
}

// TestVisionMultiImageQwen3VL: Qwen3-VL's images keep their own grids; with
// --max-images-per-request 2 a request with two images of different sizes and text between
// them is served (200), its usage counts both images' tokens, the record lists each image's
// size and tokens in order, swapping the images changes the logits, and a third image is
// refused naming the flag.
func TestVisionMultiImageQwen3VL(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.Qwen3VLTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, p, "--workers", "1", "--threads", "2", "--max-images-per-request", "2")
	scene := dataURL(t, root, "fixtures/images/qwen3vl/02-scene-300x200.png") // grid 12x18: 54 tokens
	gray := dataURL(t, root, "fixtures/images/qwen3vl/04-gray-96x130.png")    // grid 8x6: 12 tokens
	chat := interleavedChat([]string{scene, gray}, "First picture:", "Second picture:", "Which one has colour?")
	code, _, body := s.post("/v1/chat/completions", chat)
	if code != 200 {
		t.Fatalf("two images: %d %s", code, body)
	}
	var resp struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Usage.PromptTokens < 54+12+4 {
		t.Fatalf("two images: prompt_tokens %d (%v), fewer than the images' 66 tokens and their frames", resp.Usage.PromptTokens, err)
	}
	a := lastLogitsRow(t, s, chat)
	b := lastLogitsRow(t, s, interleavedChat([]string{gray, scene}, "First picture:", "Second picture:", "Which one has colour?"))
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	if d < 1e-2 {
		t.Errorf("swapping the two images moves the last logits by only %.3g: image order does not reach the model", d)
	}
	code, _, body = s.post("/v1/chat/completions", multiImageChat([]string{gray, gray, scene}, "Three?"))
	if code != 400 || !strings.Contains(string(body), "--max-images-per-request") || !strings.Contains(string(body), "content[2]") {
		t.Errorf("three images with --max-images-per-request 2: %d %s; want 400 naming the flag and the third part", code, body)
	}
	raw, err := os.ReadFile(s.records)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var r multiRecord
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 || len(r.VisionImages) != 2 || r.VisionImages[0].ImageTokens != 54 || r.VisionImages[1].ImageTokens != 12 ||
		r.VisionImages[0].BytesSHA256 == r.VisionImages[1].BytesSHA256 || r.Vision == nil || r.Vision.ImageTokens != 54 {
		t.Fatalf("record of the two-image request: %s", lines[0])
	}
	if r.InputTokens != resp.Usage.PromptTokens {
		t.Errorf("record input_tokens %d, usage prompt_tokens %d", r.InputTokens, resp.Usage.PromptTokens)
	}
}

// TestVisionMultiImageQwen3VLDefaultOne: without the flag (default 1, the seeds' contract) a
// second image is refused with a 400 naming the flag.
func TestVisionMultiImageQwen3VLDefaultOne(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.Qwen3VLTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, p, "--workers", "1", "--threads", "2")
	gray := dataURL(t, root, "fixtures/images/qwen3vl/04-gray-96x130.png")
	code, _, body := s.post("/v1/chat/completions", multiImageChat([]string{gray, gray}, "Two?"))
	if code != 400 || !strings.Contains(string(body), "--max-images-per-request 1") {
		t.Errorf("two images with the default limit: %d %s; want 400 naming --max-images-per-request 1", code, body)
	}
}

// TestVisionMultiImageQwen3VLAcceptedOnCUDA: qwen3vl's GPU model takes several images (ABI 6's
// mqb_set_images), so --max-images-per-request 2 with --device cuda passes the start-up checks
// that read the bundle; with MODELQUAL_CUDA_LIB naming no library the start then fails on
// loading it, never on the flag.
func TestVisionMultiImageQwen3VLAcceptedOnCUDA(t *testing.T) {
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.Qwen3VLTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, serverBin, "--bundle", p, "--model-name", "m", "--port", strconv.Itoa(freePort(t)),
		"--workers", "1", "--device", "cuda", "--max-images-per-request", "2")
	cmd.Env = append(os.Environ(), "MODELQUAL_CUDA_LIB="+filepath.Join(t.TempDir(), "no-such-lib.so"))
	out, err := cmd.CombinedOutput()
	if err == nil || strings.Contains(string(out), "--max-images-per-request") || !strings.Contains(string(out), "libmodelqual_cuda.so") {
		t.Fatalf("qwen3vl on cuda with --max-images-per-request 2 and no CUDA library: %v\n%s\nwant a start that fails on loading the library, not on the flag", err, out)
	}
}
