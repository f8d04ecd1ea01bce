package load

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"strings"
	"testing"
)

// TestWithImagesSynthetic: every prompt becomes one user message whose first part is an image
// of the asked size (stddev 0) and whose second is the prompt's text; images differ.
func TestWithImagesSynthetic(t *testing.T) {
	ps, err := WithImages([]Prompt{{Prompt: "a"}, {Prompt: "b"}}, ImageOptions{WidthMean: 40, HeightMean: 30, Format: "png", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i, p := range ps {
		var msgs []struct {
			Role    string           `json:"role"`
			Content []map[string]any `json:"content"`
		}
		if err := json.Unmarshal(p.Messages, &msgs); err != nil || len(msgs) != 1 || len(msgs[0].Content) != 2 {
			t.Fatalf("prompt %d: %s (%v)", i, p.Messages, err)
		}
		url := msgs[0].Content[0]["image_url"].(map[string]any)["url"].(string)
		b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(b))
		if err != nil || cfg.Width != 40 || cfg.Height != 30 {
			t.Fatalf("image %d: %+v %v", i, cfg, err)
		}
		if msgs[0].Content[1]["text"] != []string{"a", "b"}[i] {
			t.Fatalf("text part %v", msgs[0].Content[1])
		}
		urls = append(urls, url)
	}
	if urls[0] == urls[1] {
		t.Fatal("two requests carry the same synthetic image")
	}
	if _, err := WithImages([]Prompt{{Prompt: "a"}}, ImageOptions{WidthMean: 4, HeightMean: 4, Format: "gif"}); err == nil {
		t.Fatal("format gif accepted")
	}
}

// TestWithImagesFraction: --image-fraction 0.5 gives every other prompt an image and leaves
// the rest text-only (unchanged), so one run holds both kinds; a fraction beyond 1 is refused.
func TestWithImagesFraction(t *testing.T) {
	in := []Prompt{{Prompt: "a"}, {Prompt: "b"}, {Prompt: "c"}, {Prompt: "d"}}
	ps, err := WithImages(in, ImageOptions{WidthMean: 8, HeightMean: 8, Format: "png", Seed: 1, Fraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	var with []bool
	for i, p := range ps {
		with = append(with, len(p.Messages) > 0)
		if len(p.Messages) == 0 && p.Prompt != in[i].Prompt {
			t.Errorf("text-only prompt %d changed: %+v", i, p)
		}
	}
	// The first prompt carries an image: the warmup sends the first prompts, so it runs the
	// vision encoder before anything is measured (and the text path with its second request).
	if fmt.Sprint(with) != "[true false true false]" {
		t.Errorf("prompts with an image: %v, want every other one, the first among them", with)
	}
	ps, err = WithImages(append(in, in...), ImageOptions{WidthMean: 8, HeightMean: 8, Format: "png", Seed: 1, Fraction: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	with = with[:0]
	for _, p := range ps {
		with = append(with, len(p.Messages) > 0)
	}
	if fmt.Sprint(with) != "[true false false false true false false false]" {
		t.Errorf("fraction 0.25: prompts with an image: %v, want one in four, the first among them", with)
	}
	if _, err := WithImages(in, ImageOptions{WidthMean: 8, HeightMean: 8, Format: "png", Fraction: 1.5}); err == nil {
		t.Error("fraction 1.5 accepted")
	}
}

// TestWithImagesPerRequest: --images-per-request 2 puts two different images before the text
// of every request, drawn in order from the pool (AIPerf's --batch-size-image).
func TestWithImagesPerRequest(t *testing.T) {
	ps, err := WithImages([]Prompt{{Prompt: "a"}, {Prompt: "b"}}, ImageOptions{WidthMean: 20, HeightMean: 10, Format: "png", Seed: 1, PerRequest: 2})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, p := range ps {
		var msgs []struct {
			Content []map[string]any `json:"content"`
		}
		if err := json.Unmarshal(p.Messages, &msgs); err != nil || len(msgs) != 1 || len(msgs[0].Content) != 3 {
			t.Fatalf("prompt %d: %s (%v); want two image parts and the text", i, p.Messages, err)
		}
		for _, part := range msgs[0].Content[:2] {
			if part["type"] != "image_url" {
				t.Fatalf("prompt %d: part %v is not an image", i, part)
			}
			seen[part["image_url"].(map[string]any)["url"].(string)] = true
		}
		if msgs[0].Content[2]["text"] != []string{"a", "b"}[i] {
			t.Fatalf("prompt %d: last part %v, want the text", i, msgs[0].Content[2])
		}
	}
	if len(seen) != 4 {
		t.Fatalf("%d distinct images over 2 requests of 2, want 4", len(seen))
	}
}
