package native

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// recordingTokenizer renders a chat as "TEMPLATE(role:content|gen|kwargs)" and encodes text as
// one id per byte, recording what it was asked.
type recordingTokenizer struct {
	templated int
	padded    int
	kwargs    map[string]any
	addGen    bool
}

func (r *recordingTokenizer) ApplyChatTemplate(msgs []map[string]any, addGen bool, kwargs map[string]any) (string, error) {
	r.templated++
	r.kwargs, r.addGen = kwargs, addGen
	kw, _ := json.Marshal(kwargs)
	return "T(" + msgs[0]["role"].(string) + ":" + msgs[0]["content"].(string) + "|" + string(kw) + ")", nil
}

// EncodePadded pads Encode's ids with 0 (after a 1 standing for an end token) up to n, cutting
// to n.
func (r *recordingTokenizer) EncodePadded(text string, n int) ([]int32, []int32, error) {
	r.padded++
	ids := append(r.Encode(text), 1)
	if len(ids) > n {
		ids = append(ids[:n-1], 1)
	}
	mask := make([]int32, n)
	for i := range ids {
		mask[i] = 1
	}
	return append(ids, make([]int32, n-len(ids))...), mask, nil
}

func (r *recordingTokenizer) Encode(text string) []int32 {
	ids := make([]int32, len(text))
	for i := range text {
		ids[i] = int32(text[i])
	}
	return ids
}

// The zimage family declares ZImagePipeline's rule (chat template, generation prompt,
// enable_thinking=True) in its resolve step; IDs applies exactly that.
func TestImagePromptIsWhatTheFamilyDeclares(t *testing.T) {
	h := testBundle(t, fixtures.ZImageTiny).Header()
	rule, err := ImagePromptFor(h.Family, h.Config)
	if err != nil {
		t.Fatal(err)
	}
	if rule.Format != PromptChatTemplate || !reflect.DeepEqual(rule.TemplateKwargs, map[string]any{"enable_thinking": true}) {
		t.Fatalf("zimage's prompt rule = %+v, want the chat template with enable_thinking=true", rule)
	}
	tok := &recordingTokenizer{}
	ids, err := rule.IDs(tok, "a red fox")
	if err != nil {
		t.Fatal(err)
	}
	want := `T(user:a red fox|{"enable_thinking":true})`
	if tok.templated != 1 || !tok.addGen || string(int32sToBytes(ids)) != want {
		t.Fatalf("IDs rendered %q (templated %d times, generation prompt %v), want %q once with the generation prompt",
			int32sToBytes(ids), tok.templated, tok.addGen, want)
	}

	plain := ImagePrompt{Family: "flux-like", Format: PromptPlain}
	tok = &recordingTokenizer{}
	ids, err = plain.IDs(tok, "a red fox")
	if err != nil || tok.templated != 0 || string(int32sToBytes(ids)) != "a red fox" {
		t.Fatalf("plain IDs = %q, %v (templated %d times), want the text as it is", int32sToBytes(ids), err, tok.templated)
	}
	if _, err := (ImagePrompt{Family: "x"}).IDs(tok, "p"); err == nil {
		t.Fatal("IDs with no format must be refused")
	}
}

// A family that declares no prompt rule is refused, naming the key and where to declare it.
func TestImagePromptForRefusesAFamilyWithoutARule(t *testing.T) {
	h := testBundle(t, fixtures.Qwen3Tiny).Header()
	_, err := ImagePromptFor(h.Family, h.Config)
	if err == nil || !strings.Contains(err.Error(), "declares no prompt.format") || !strings.Contains(err.Error(), "native/models/qwen3.cc") {
		t.Fatalf("ImagePromptFor(qwen3) = %v, want an error saying qwen3 declares no prompt.format in native/models/qwen3.cc", err)
	}
}

func int32sToBytes(ids []int32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}
