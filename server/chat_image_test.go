package server_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// visionGolden is what the chat-route tests read of fixtures/golden/qwen3vl-tiny.json.
type visionGolden struct {
	Entries []struct {
		Name, Image, Prompt, Rendered string
		Width, Height                 int
		ResizedWidth                  int       `json:"resized_width"`
		ResizedHeight                 int       `json:"resized_height"`
		ImageTokens                   int       `json:"image_tokens"`
		PromptIDs                     []int32   `json:"prompt_ids"`
		GreedyIDs                     []int32   `json:"greedy_ids"`
		ImageBytesSHA256              string    `json:"image_bytes_sha256"`
		FirstTop20IDs                 []int32   `json:"first_top20_ids"`
		FirstTop20Logits              []float64 `json:"first_top20_logits"`
	}
}

func visionSetup(t *testing.T) (*testServer, *visionGolden, *tokenizer.Tokenizer, string) {
	t.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "fixtures", "golden", "qwen3vl-tiny.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g visionGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	bundleMu.Lock()
	p, err := fixtures.Bundle(cacheDir, fixtures.Qwen3VLTiny)
	bundleMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := fixtures.Ensure(cacheDir, fixtures.Qwen3VLTiny)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(snap)
	if err != nil {
		t.Fatal(err)
	}
	return startServer(t, p, "--workers", "1", "--threads", "2"), &g, tok, root
}

func dataURL(t *testing.T, root, path string) string {
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	mime := "image/png"
	if strings.HasSuffix(path, ".jpg") {
		mime = "image/jpeg"
	}
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func imageChat(url, text string, extra string) string {
	msg := map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
		map[string]any{"type": "text", "text": text},
	}}
	b, _ := json.Marshal(map[string]any{"model": "test-model", "messages": []any{msg}, "max_tokens": 32, "temperature": 0, "ignore_eos": true})
	if extra != "" {
		return strings.TrimSuffix(string(b), "}") + "," + extra + "}"
	}
	return string(b)
}

type chatAnswer struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

// TestVisionChatCorpus: /v1/chat/completions with one image per request answers as
// transformers does on the 10-image corpus (32 greedy tokens, the prompt rendered and expanded
// to the same token count, the rendered text identical), and every record carries the image's
// identity and preprocessing.
func TestVisionChatCorpus(t *testing.T) {
	s, g, tok, root := visionSetup(t)
	pass := 0
	var rows []string
	for _, e := range g.Entries {
		code, _, body := s.post("/v1/chat/completions", imageChat(dataURL(t, root, e.Image), e.Prompt, ""))
		if code != 200 {
			t.Fatalf("%s: %d %s", e.Name, code, body)
		}
		var a chatAnswer
		if err := json.Unmarshal(body, &a); err != nil || len(a.Choices) != 1 {
			t.Fatalf("%s: %v %s", e.Name, err, body)
		}
		want := tok.Decode(e.GreedyIDs)
		ok := a.Choices[0].Message.Content == want && a.Usage.PromptTokens == len(e.PromptIDs)
		if ok {
			pass++
		} else {
			t.Errorf("%s: prompt tokens %d (transformers %d); content %q, transformers %q", e.Name, a.Usage.PromptTokens, len(e.PromptIDs), a.Choices[0].Message.Content, want)
		}
		rows = append(rows, fmt.Sprintf("%-18s prompt tokens %3d  match %v", e.Name, a.Usage.PromptTokens, ok))
	}
	t.Logf("chat route vs transformers: %d/%d\n%s", pass, len(g.Entries), strings.Join(rows, "\n"))
	s.stop()
	recs := readVisionRecords(t, s)
	if len(recs) != len(g.Entries) {
		t.Fatalf("%d records for %d requests", len(recs), len(g.Entries))
	}
	for i, r := range recs {
		e := g.Entries[i]
		v := r.Vision
		sum := sha256.Sum256([]byte(e.Rendered))
		switch {
		case v == nil:
			t.Errorf("%s: record has no vision fields", e.Name)
		case v.BytesSHA256 != e.ImageBytesSHA256 || len(v.PixelsSHA256) != 64:
			t.Errorf("%s: image sha256 %q / %q, want bytes %s", e.Name, v.BytesSHA256, v.PixelsSHA256, e.ImageBytesSHA256)
		case v.OriginalWidth != e.Width || v.OriginalHeight != e.Height || v.ResizedWidth != e.ResizedWidth || v.ResizedHeight != e.ResizedHeight:
			t.Errorf("%s: sizes %+v", e.Name, v)
		case v.ImageTokens != e.ImageTokens || v.PreprocessNs <= 0:
			t.Errorf("%s: image tokens %d (want %d), preprocess %d ns", e.Name, v.ImageTokens, e.ImageTokens, v.PreprocessNs)
		case r.InputTokens != len(e.PromptIDs) || r.Status != 200:
			t.Errorf("%s: input tokens %d (want %d), status %d", e.Name, r.InputTokens, len(e.PromptIDs), r.Status)
		case r.PromptSHA256 != hex.EncodeToString(sum[:]):
			t.Errorf("%s: the rendered prompt differs from transformers' apply_chat_template", e.Name)
		}
	}
}

type visionRecord struct {
	Status       int    `json:"status"`
	InputTokens  int    `json:"input_tokens"`
	OutputTokens int    `json:"output_tokens"`
	PromptSHA256 string `json:"prompt_sha256"`
	ErrorMessage string `json:"error_message"`
	TTFTNs       int64  `json:"ttft_ns"`
	TaskTTFTNs   int64  `json:"task_ttft_ns"`
	VisionNs     *int64 `json:"vision_ns"`
	Vision       *struct {
		BytesSHA256    string `json:"image_bytes_sha256"`
		PixelsSHA256   string `json:"image_pixels_sha256"`
		OriginalWidth  int    `json:"original_width"`
		OriginalHeight int    `json:"original_height"`
		ResizedWidth   int    `json:"resized_width"`
		ResizedHeight  int    `json:"resized_height"`
		ImageTokens    int    `json:"image_tokens"`
		PreprocessNs   int64  `json:"preprocess_ns"`
	} `json:"vision"`
}

func readVisionRecords(t *testing.T, s *testServer) []visionRecord {
	b, err := os.ReadFile(s.records)
	if err != nil {
		t.Fatal(err)
	}
	var out []visionRecord
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r visionRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestVisionTowerTime: an image request's record carries the engine's vision tower time
// (vision_ns), positive and within both the engine's and the server's time to first token, and
// its timings answer vision_ms from it; a text request's record has no vision_ns and its
// timings no vision_ms. Both CPU vision families: qwen3vl-tiny and internvl-tiny.
func TestVisionTowerTime(t *testing.T) {
	root, err := fixtures.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("qwen3vl", func(t *testing.T) {
		s, g, _, root := visionSetup(t)
		e := g.Entries[0]
		checkVisionTowerTime(t, s, imageChat(dataURL(t, root, e.Image), e.Prompt, `"timings_per_token":true`))
	})
	t.Run("internvl", func(t *testing.T) {
		bundleMu.Lock()
		p, err := fixtures.Bundle(cacheDir, fixtures.InternVLTiny)
		bundleMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		s := startServer(t, p, "--workers", "1", "--threads", "2")
		url := dataURL(t, root, "fixtures/images/internvl/01-square-448x448.png")
		checkVisionTowerTime(t, s, imageChat(url, "Describe the image.", `"timings_per_token":true`))
	})
}

func checkVisionTowerTime(t *testing.T, s *testServer, imageBody string) {
	t.Helper()
	text := `{"model":"test-model","messages":[{"role":"user","content":"Describe a cat."}],"max_tokens":4,"temperature":0,"ignore_eos":true,"timings_per_token":true}`
	var timings []map[string]float64
	for _, b := range []string{imageBody, text} {
		code, _, body := s.post("/v1/chat/completions", b)
		var a struct {
			Timings map[string]float64 `json:"timings"`
		}
		if code != 200 || json.Unmarshal(body, &a) != nil || a.Timings == nil {
			t.Fatalf("%d %s", code, body)
		}
		timings = append(timings, a.Timings)
	}
	s.stop()
	recs := readVisionRecords(t, s)
	if len(recs) != 2 {
		t.Fatalf("%d records for 2 requests", len(recs))
	}
	img, txt := recs[0], recs[1]
	switch {
	case img.VisionNs == nil || *img.VisionNs <= 0:
		t.Errorf("image request: vision_ns %v, want > 0", img.VisionNs)
	case *img.VisionNs >= img.TaskTTFTNs || *img.VisionNs >= img.TTFTNs:
		t.Errorf("image request: vision_ns %d not below task_ttft_ns %d and ttft_ns %d", *img.VisionNs, img.TaskTTFTNs, img.TTFTNs)
	case math.Abs(timings[0]["vision_ms"]-float64(*img.VisionNs)/1e6) > 1e-9*math.Max(1, timings[0]["vision_ms"]):
		t.Errorf("image request: timings.vision_ms %v, record vision_ns %d", timings[0]["vision_ms"], *img.VisionNs)
	default:
		t.Logf("image request: vision %.3f ms of task TTFT %.3f ms, TTFT %.3f ms", float64(*img.VisionNs)/1e6, float64(img.TaskTTFTNs)/1e6, float64(img.TTFTNs)/1e6)
	}
	if txt.VisionNs != nil || txt.Vision != nil || txt.TaskTTFTNs <= 0 {
		t.Errorf("text request: vision_ns %v, vision %v, task_ttft_ns %d", txt.VisionNs, txt.Vision, txt.TaskTTFTNs)
	}
	if _, ok := timings[1]["vision_ms"]; ok {
		t.Errorf("text request: timings carry vision_ms %v", timings[1]["vision_ms"])
	}
}

// TestVisionStreamMatches: the streamed deltas of an image request concatenate to the
// non-streamed answer.
func TestVisionStreamMatches(t *testing.T) {
	s, g, _, root := visionSetup(t)
	e := g.Entries[3]
	body := imageChat(dataURL(t, root, e.Image), e.Prompt, "")
	_, _, plain := s.post("/v1/chat/completions", body)
	var a chatAnswer
	if err := json.Unmarshal(plain, &a); err != nil || len(a.Choices) != 1 {
		t.Fatalf("%v %s", err, plain)
	}
	code, _, sb := s.post("/v1/chat/completions", imageChat(dataURL(t, root, e.Image), e.Prompt, `"stream":true`))
	if code != 200 {
		t.Fatalf("stream: %d %s", code, sb)
	}
	var got strings.Builder
	for _, ev := range parseSSE(t, string(sb)) {
		if ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(ev), &c) == nil && len(c.Choices) > 0 {
			got.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if got.String() != a.Choices[0].Message.Content || got.Len() == 0 {
		t.Fatalf("stream %q != non-stream %q", got.String(), a.Choices[0].Message.Content)
	}
}

// TestVisionRefusals: each refusal of the image contract is a 400 naming its reason, and the
// next valid request answers 200.
func TestVisionRefusals(t *testing.T) {
	s, g, _, root := visionSetup(t)
	e := g.Entries[2]
	good := imageChat(dataURL(t, root, e.Image), e.Prompt, "")
	png := dataURL(t, root, e.Image)
	img := func(url string) map[string]any {
		return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	}
	txt := map[string]any{"type": "text", "text": "hi"}
	req := func(msgs ...map[string]any) string {
		b, _ := json.Marshal(map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 4})
		return string(b)
	}
	user := func(parts ...any) map[string]any { return map[string]any{"role": "user", "content": parts} }
	// A PNG header declaring 100000 x 100000 pixels (a decompression bomb).
	bomb, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(png, "data:image/png;base64,"))
	bomb = append([]byte{}, bomb...)
	copy(bomb[16:24], []byte{0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0})
	crc := crc32.ChecksumIEEE(bomb[12:29]) // IHDR's type and data
	copy(bomb[29:33], []byte{byte(crc >> 24), byte(crc >> 16), byte(crc >> 8), byte(crc)})
	// Text that fits the 4096-token context alone but not with the 640x480 image's 54 tokens.
	long := strings.Repeat(" word", 4040)
	photo := dataURL(t, root, g.Entries[0].Image)
	cases := []struct{ name, body, want string }{
		{"second image", req(user(img(png), img(png), txt)), "second image"},
		{"second image in another message", req(user(img(png), txt), map[string]any{"role": "assistant", "content": "ok"}, user(img(png), txt)), "second image"},
		{"image in system", req(map[string]any{"role": "system", "content": []any{img(png)}}, user(txt)), "system message"},
		{"image in assistant", req(user(txt), map[string]any{"role": "assistant", "content": []any{img(png)}}), "assistant message"},
		{"http url", req(user(img("https://example.com/a.png"), txt)), "fetches nothing"},
		{"file url", req(user(img("file:///etc/passwd"), txt)), "fetches nothing"},
		{"video", req(user(map[string]any{"type": "video_url", "video_url": map[string]any{"url": "data:video/mp4;base64,AAAA"}})), "video_url"},
		{"audio", req(user(map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": "AAAA", "format": "wav"}})), "input_audio"},
		{"file", req(user(map[string]any{"type": "file", "file": map[string]any{"file_data": "AAAA"}})), `\"file\" is not supported`},
		{"detail high", req(user(map[string]any{"type": "image_url", "image_url": map[string]any{"url": png, "detail": "high"}}, txt)), "detail"},
		{"empty data", req(user(img("data:image/png;base64,"), txt)), "no image data"},
		{"undecodable", req(user(img("data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\nnot a png at all"))), txt)), "does not decode"},
		{"not an image", req(user(img("data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("hello world"))), txt)), "neither PNG nor JPEG"},
		{"mime mismatch", req(user(img(strings.Replace(png, "image/png", "image/jpeg", 1)), txt)), "disagrees"},
		{"decompression bomb", req(user(img("data:image/png;base64,"+base64.StdEncoding.EncodeToString(bomb)), txt)), "before decoding"},
		{"image tokens overflow the context", req(user(img(photo), map[string]any{"type": "text", "text": long})), "context"},
	}
	for _, c := range cases {
		code, _, body := s.post("/v1/chat/completions", c.body)
		if code != 400 || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s; want 400 naming %q", c.name, code, body, c.want)
		}
		if code, _, body := s.post("/v1/chat/completions", good); code != 200 {
			t.Fatalf("after %s the valid request got %d %s", c.name, code, body)
		}
	}
}

// TestVisionLogitsTokenize: /tokenize and /mq/v1/logits take the chat route's one-image message.
// /tokenize returns transformers' input_ids (placeholder expanded) and /mq/v1/logits the
// first-step logits within the fp32 bound on every corpus image; image token ids without the
// image are refused, and the next request answers 200.
func TestVisionLogitsTokenize(t *testing.T) {
	s, g, _, root := visionSetup(t)
	worst := 0.0
	for _, e := range g.Entries {
		msg := imageChat(dataURL(t, root, e.Image), e.Prompt, "")
		var m map[string]any
		_ = json.Unmarshal([]byte(msg), &m)
		b, _ := json.Marshal(map[string]any{"model": "test-model", "messages": m["messages"]})
		code, _, body := s.post("/tokenize", string(b))
		var tk struct {
			Tokens      []int32 `json:"tokens"`
			ImageTokens int     `json:"image_tokens"`
		}
		if code != 200 || json.Unmarshal(body, &tk) != nil {
			t.Fatalf("%s: /tokenize %d %s", e.Name, code, body)
		}
		if fmt.Sprint(tk.Tokens) != fmt.Sprint(e.PromptIDs) || tk.ImageTokens != e.ImageTokens {
			t.Errorf("%s: /tokenize gave %d ids (%d image tokens), transformers %d (%d)", e.Name, len(tk.Tokens), tk.ImageTokens, len(e.PromptIDs), e.ImageTokens)
		}
		code, _, body = s.post("/mq/v1/logits", string(b))
		var lg struct {
			Vocab     int    `json:"vocab_size"`
			Positions int    `json:"positions"`
			Data      string `json:"data"`
		}
		if code != 200 || json.Unmarshal(body, &lg) != nil {
			t.Fatalf("%s: /mq/v1/logits %d %.300s", e.Name, code, body)
		}
		raw, err := base64.StdEncoding.DecodeString(lg.Data)
		if err != nil || lg.Positions != len(e.PromptIDs) || len(raw) != 4*lg.Vocab*lg.Positions {
			t.Fatalf("%s: %d positions (want %d), %d bytes, %v", e.Name, lg.Positions, len(e.PromptIDs), len(raw), err)
		}
		last := (lg.Positions - 1) * lg.Vocab
		for j, id := range e.FirstTop20IDs {
			v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(last+int(id)):]))
			worst = math.Max(worst, math.Abs(float64(v)-e.FirstTop20Logits[j]))
		}
	}
	if worst > 1e-3 {
		t.Errorf("first-step logits through /mq/v1/logits: max |diff| %.3g over the corpus, bound 1e-3", worst)
	}
	t.Logf("first-step top-20 logits through /mq/v1/logits vs transformers: max |diff| %.3g over %d images", worst, len(g.Entries))
	e := g.Entries[2]
	code, _, body := s.post("/mq/v1/logits", fmt.Sprintf(`{"prompt_token_ids": %s}`, strings.ReplaceAll(fmt.Sprint(e.PromptIDs), " ", ",")))
	if code != 400 || !strings.Contains(string(body), "image token") {
		t.Errorf("image token ids without the image: %d %s", code, body)
	}
	if code, _, body = s.post("/mq/v1/logits", `{"prompt_token_ids": [1, 2, 3]}`); code != 200 {
		t.Errorf("the next request: %d %s", code, body)
	}
}
