package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestChatTemplateBranches renders the Qwen3 template's other branches (tools, tool calls,
// tool responses, reasoning, history) against testdata/chat_golden.json, which
// testdata/make_chat_golden.py renders with Jinja2 in transformers' environment. Every case
// runs with its inputs as json.RawMessage (key order and floats kept); cases whose keys are
// sorted also run as plain Go maps.
func TestChatTemplateBranches(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "chat_golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []struct {
			Name                string            `json:"name"`
			Ordered             bool              `json:"ordered"`
			Messages            []json.RawMessage `json:"messages"`
			Tools               json.RawMessage   `json:"tools"`
			AddGenerationPrompt bool              `json:"add_generation_prompt"`
			Kwargs              map[string]any    `json:"kwargs"`
			Rendered            string            `json:"rendered"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("chat_golden.json has no cases")
	}
	tok := fixtureTokenizer(t, "qwen3")
	for _, c := range g.Cases {
		for _, raw := range []bool{true, false} {
			if !raw && c.Ordered {
				continue // Go maps cannot carry this case's key order
			}
			t.Run(fmt.Sprintf("%s/raw=%v", c.Name, raw), func(t *testing.T) {
				kwargs := maps.Clone(c.Kwargs)
				if kwargs == nil {
					kwargs = map[string]any{}
				}
				var msgs []Message
				for _, m := range c.Messages {
					var msg Message
					if raw {
						var fields map[string]json.RawMessage
						if err := json.Unmarshal(m, &fields); err != nil {
							t.Fatal(err)
						}
						msg = Message{}
						for k, v := range fields {
							msg[k] = v
						}
					} else if err := json.Unmarshal(m, &msg); err != nil {
						t.Fatal(err)
					}
					msgs = append(msgs, msg)
				}
				if c.Tools != nil && string(c.Tools) != "null" {
					if raw {
						kwargs["tools"] = c.Tools
					} else {
						var tools []any
						if err := json.Unmarshal(c.Tools, &tools); err != nil {
							t.Fatal(err)
						}
						kwargs["tools"] = tools
					}
				}
				got, err := tok.ApplyChatTemplate(msgs, c.AddGenerationPrompt, kwargs)
				if err != nil {
					t.Fatal(err)
				}
				if got != c.Rendered {
					t.Errorf("rendering differs\n got %q\nwant %q", got, c.Rendered)
				}
			})
		}
	}
	// The ordered-key registry is per render: nothing may be left behind.
	orderedKeys.Range(func(k, _ any) bool {
		t.Errorf("orderedKeys still holds %v after the renders finished", k)
		return false
	})
}

func tinyWithTemplate(t *testing.T, template string) *Tokenizer {
	t.Helper()
	cfg, _ := json.Marshal(map[string]any{"chat_template": template, "eos_token": "<|end|>"})
	tok, err := FromBytes([]byte(tinyTokenizerJSON), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestChatTemplateRaiseException(t *testing.T) {
	tok := tinyWithTemplate(t, `{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}`)
	_, err := tok.ApplyChatTemplate([]Message{{"role": "robot", "content": "x"}}, false, nil)
	if err == nil || !strings.Contains(err.Error(), "Unknown role: robot") {
		t.Fatalf("want the template's exception message, got %v", err)
	}
	got, err := tok.ApplyChatTemplate([]Message{{"role": "user", "content": "fine"}}, false, nil)
	if err != nil || got != "fine" {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestChatTemplateVariables(t *testing.T) {
	tok := tinyWithTemplate(t, "{{ eos_token }}|{{ bos_token is defined }}|{{ add_generation_prompt }}|{{ tools is none }}|{{ custom }}\n")
	got, err := tok.ApplyChatTemplate(nil, true, map[string]any{"custom": "kw"})
	if err != nil {
		t.Fatal(err)
	}
	// bos_token is unset in the config, so (as in transformers) the template sees it undefined;
	// the template's trailing newline is dropped (keep_trailing_newline=False).
	if want := "<|end|>|False|True|True|kw"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestChatTemplateToJSON(t *testing.T) {
	tok := tinyWithTemplate(t, `{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ {"b": 1, "a": [1.5, none, true]} | tojson }}`)
	got, err := tok.ApplyChatTemplate(nil, false, map[string]any{"x": map[string]any{"z": "é\n\"", "a": 1e-7, "m": 12.0}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"a": 1e-07, "m": 12, "z": "é\n\""}|{
  "a": 1e-07,
  "m": 12,
  "z": "é\n\""
}|{"b": 1, "a": [1.5, null, true]}`
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestChatTemplateErrors(t *testing.T) {
	cfg := []byte(`{"chat_template": "line one\n{% if %}"}`)
	if _, err := FromBytes([]byte(tinyTokenizerJSON), cfg); err == nil || !strings.Contains(err.Error(), "chat_template does not parse at line 2") {
		t.Fatalf("want a chat_template parse error, got %v", err)
	}
	tok, err := FromBytes([]byte(tinyTokenizerJSON), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok.HasChatTemplate() {
		t.Fatal("no tokenizer_config.json, yet HasChatTemplate")
	}
	if _, err := tok.ApplyChatTemplate([]Message{{"role": "user", "content": "x"}}, true, nil); err == nil {
		t.Fatal("ApplyChatTemplate without a template must fail")
	}
}

func TestChatTemplateGenerationTag(t *testing.T) {
	tok := tinyWithTemplate(t, "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}[{{ m.content }}]{% endif %}{% endfor %}")
	got, err := tok.ApplyChatTemplate([]Message{{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}}, false, nil)
	if err != nil || got != "[q]a" {
		t.Fatalf("got %q, %v", got, err)
	}
}
