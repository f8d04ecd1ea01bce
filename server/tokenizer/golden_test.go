package tokenizer

import (
	"slices"
	"testing"
)

func TestGoldenEncodeDecode(t *testing.T) {
	g := loadGolden(t)
	for _, tc := range []struct {
		name    string
		entries []goldenEncode
	}{{"gpt2", g.GPT2}, {"qwen3", g.Qwen3}} {
		tok := fixtureTokenizer(t, tc.name)
		for i, e := range tc.entries {
			got := tok.Encode(e.Text)
			if !slices.Equal(got, e.IDs) {
				t.Errorf("%s[%d] Encode(%q)\n got %v\nwant %v", tc.name, i, e.Text, got, e.IDs)
			}
			if d := tok.Decode(e.IDs); d != e.Decoded {
				t.Errorf("%s[%d] Decode(%v)\n got %q\nwant %q", tc.name, i, e.IDs, d, e.Decoded)
			}
		}
	}
}

func TestGoldenChat(t *testing.T) {
	g := loadGolden(t)
	tok := fixtureTokenizer(t, "qwen3")
	if !tok.HasChatTemplate() {
		t.Fatal("qwen3 fixture has no chat template")
	}
	for i, c := range g.Qwen3Chat {
		kwargs := map[string]any{}
		if c.EnableThinking != nil {
			kwargs["enable_thinking"] = *c.EnableThinking
		}
		got, err := tok.ApplyChatTemplate(c.Messages, c.AddGenerationPrompt, kwargs)
		if err != nil {
			t.Errorf("qwen3_chat[%d]: %v", i, err)
			continue
		}
		if got != c.Rendered {
			t.Errorf("qwen3_chat[%d] rendering\n got %q\nwant %q", i, got, c.Rendered)
		}
		if ids := tok.Encode(got); !slices.Equal(ids, c.IDs) {
			t.Errorf("qwen3_chat[%d] ids\n got %v\nwant %v", i, ids, c.IDs)
		}
	}
}
