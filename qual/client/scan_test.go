package client

import (
	"encoding/json"
	"math"
	"testing"
)

// refChunk is the reference extraction with encoding/json: what parseChunk must agree with.
func refChunk(data []byte) (text string, info chunkInfo, ok bool, comparable bool) {
	if !json.Valid(data) {
		return "", chunkInfo{}, false, true
	}
	var top map[string]any
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		// Valid JSON that is not an object (array, string, null...).
		return "", chunkInfo{}, false, true
	}
	comparable = true
	if ch, ok := top["choices"].([]any); ok {
		for _, c := range ch {
			cm, ok := c.(map[string]any)
			if !ok {
				continue
			}
			_, hasD := cm["delta"]
			_, hasM := cm["message"]
			if hasD && hasM {
				comparable = false // parseChunk treats both as one slot; not comparable
			}
			d, _ := cm["delta"].(map[string]any)
			if d == nil {
				d, _ = cm["message"].(map[string]any)
			}
			if d != nil {
				r, _ := d["reasoning_content"].(string)
				if r == "" {
					r, _ = d["reasoning"].(string)
				}
				text += r
				s, _ := d["content"].(string)
				text += s
			}
			t, _ := cm["text"].(string)
			text += t
			if fr, ok := cm["finish_reason"].(string); ok && fr != "" {
				info.finishReason = fr
			}
		}
	}
	if u, ok := top["usage"].(map[string]any); ok {
		pt, pok := u["prompt_tokens"].(float64)
		ct, cok := u["completion_tokens"].(float64)
		isInt := func(f float64) bool { return f == math.Trunc(f) && math.Abs(f) < 1e15 }
		if (pok && !isInt(pt)) || (cok && !isInt(ct)) {
			comparable = false // parseChunk only accepts plain integer literals
		}
		if pok || cok {
			info.hasUsage = true
			info.promptTokens, info.completionTokens = int(pt), int(ct)
		}
	}
	if e, ok := top["error"]; ok {
		switch e := e.(type) {
		case map[string]any:
			info.hasError = true
			info.errMessage, _ = e["message"].(string)
			info.errType, _ = e["type"].(string)
			if c, ok := e["code"].(float64); ok {
				if c != math.Trunc(c) {
					comparable = false
				}
				info.errCode = int(c)
			}
		case string:
			info.hasError = true
			info.errMessage = e
		}
	}
	info.hasContent = text != ""
	return text, info, true, comparable
}

var chunkSeeds = []string{
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" Hello","logprobs":null,"finish_reason":null}],"usage":null}`,
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi \u00e9\ud83d\ude00\n"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"think"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
	`{"id":"c","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":64,"total_tokens":76}}`,
	`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"full answer"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`,
	`{"error":{"message":"max_tokens 99999 exceeds context","type":"invalid_request_error","param":"max_tokens","code":400}}`,
	`{"error":"worker crashed"}`,
	`{"choices":[{"text":""}]}`,
	`{"choices":[{"text":"a\ud800b"}]}`,
	`{"choices":[{"text":"bad utf8 \xff here"}]}`,
	`{"choices":[{"text":"x"}]} trailing`,
	`{"choices":[{"text":"x"}]`,
	`[1,2]`,
	`"str"`,
	`{"choices":[{"text":1e5,"delta":null}],"usage":{"prompt_tokens":-0}}`,
	`{"choices":{"text":"not an array"}}`,
	`{"choices":[{"text":"a"}],"choices":[{"text":"b"}]}`,
	`{"\u0063hoices":[{"text":"escaped key"}]}`,
	` { "choices" : [ { "delta" : { "content" : "ws" } } ] } `,
	`{"choices":[{"text":"\/\b\f\t\r"}]}`,
	`{"a":[01]}`,
	`{"a":1.}`,
	`{"a":tru}`,
}

func TestParseChunkMatchesEncodingJSON(t *testing.T) {
	for _, s := range chunkSeeds {
		checkChunk(t, []byte(s))
	}
}

func checkChunk(t *testing.T, data []byte) {
	t.Helper()
	wantText, want, wantOK, comparable := refChunk(data)
	var got chunkInfo
	gotText, gotOK := parseChunk(data, []byte("prefix:"), &got)
	if gotOK != wantOK {
		t.Fatalf("parseChunk(%q) ok = %v, encoding/json says %v", data, gotOK, wantOK)
	}
	if !gotOK {
		if string(gotText) != "prefix:" {
			t.Fatalf("parseChunk(%q) changed dst on invalid input: %q", data, gotText)
		}
		return
	}
	if !comparable {
		return
	}
	if string(gotText) != "prefix:"+wantText {
		t.Fatalf("parseChunk(%q) text = %q, want %q", data, gotText[len("prefix:"):], wantText)
	}
	if got != want {
		t.Fatalf("parseChunk(%q) info = %+v, want %+v", data, got, want)
	}
}

func FuzzParseChunk(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkChunk(t, data)
	})
}

func BenchmarkParseChunk(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-4f2a","object":"chat.completion.chunk","created":1764000000,"model":"mock","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`)
	var info chunkInfo
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = parseChunk(data, dst[:0], &info)
	}
}

func BenchmarkJSONValid(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-4f2a","object":"chat.completion.chunk","created":1764000000,"model":"mock","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`)
	for b.Loop() {
		json.Valid(data)
	}
}
