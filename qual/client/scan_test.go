package client

import (
	"encoding/json"
	"math"
	"slices"
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
	// The text's one string, when the scan reports one, is where the text came from (the
	// event decoder's template relies on it).
	if got.textStrings == 1 {
		if s := appendSpan(nil, data, got.textSpan); string(s) != wantText {
			t.Fatalf("parseChunk(%q) textSpan holds %q, the text is %q", data, s, wantText)
		}
	}
	got.textStrings, got.textSpan = 0, span{}
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

// decodeEvents runs SSE events (data lines) through an eventDecoder, with or without its
// template, and returns what it made of them.
func decodeEvents(events [][]byte, noTmpl bool) Response {
	var resp Response
	d := eventDecoder{noTmpl: noTmpl}
	d.reset(&resp)
	for i, ev := range events {
		d.write([]byte("data: "), int64(2*i))
		d.write(ev, int64(2*i))
		d.write([]byte("\n\n"), int64(2*i+1))
	}
	d.end()
	return resp
}

// checkTemplate decodes first and then first with its text string replaced by mid (raw bytes
// between the quotes, valid or not), through the template and through full scans only (which
// FuzzParseChunk checks against encoding/json): the two must agree on everything.
func checkTemplate(t *testing.T, first, mid []byte) {
	t.Helper()
	var info chunkInfo
	if _, ok := parseChunk(first, nil, &info); !ok || info.textStrings != 1 {
		return
	}
	sp := info.textSpan
	second := append(append(append([]byte{}, first[:sp.start]...), mid...), first[sp.end:]...)
	events := [][]byte{first, second, first, second}
	got, want := decodeEvents(events, false), decodeEvents(events, true)
	if string(got.Text) != string(want.Text) || !slices.Equal(got.ChunkNs, want.ChunkNs) ||
		got.FinishReason != want.FinishReason || got.HasUsage != want.HasUsage ||
		got.PromptTokens != want.PromptTokens || got.CompletionTokens != want.CompletionTokens ||
		(got.Err == nil) != (want.Err == nil) || got.Err != nil && *got.Err != *want.Err {
		t.Fatalf("events %q then %q: through the template %+v, full scans %+v", first, second, got, want)
	}
}

var templateMids = []string{"", "x", " world", `a\"b`, `\u00e9\n`, `\`, `"`, `a"b`, `a","x":"`, "\x01", `\ud800`, `\q`, "\xff", `\\`, `\\"`}

func TestTemplateMatchesFullScan(t *testing.T) {
	var used int
	for _, first := range chunkSeeds {
		for _, mid := range templateMids {
			checkTemplate(t, []byte(first), []byte(mid))
		}
		var info chunkInfo
		if _, ok := parseChunk([]byte(first), nil, &info); ok && info.textStrings == 1 {
			used++
		}
	}
	if used < 5 {
		t.Fatalf("only %d seeds have a one-string text: the template is hardly exercised", used)
	}
	// And the template is taken: a stream of one server's events is scanned in full once.
	var resp Response
	d := eventDecoder{}
	d.reset(&resp)
	ev := func(s string) []byte {
		return []byte(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"` + s + `","logprobs":null,"finish_reason":null}]}`)
	}
	d.write(append(append([]byte("data: "), ev("a")...), "\n\n"...), 1)
	if !d.tmplOK || !d.fromTemplate(ev(`b\"c`)) || string(resp.Text) != `ab"c` || !d.info.hasContent {
		t.Fatalf("template ok %v, text %q, info %+v", d.tmplOK, resp.Text, d.info)
	}
	if d.fromTemplate(ev(`b"c`)) || d.fromTemplate(ev("x")[1:]) {
		t.Fatal("the template took an event that is not the template with another valid string")
	}
}

func FuzzEventTemplate(f *testing.F) {
	for _, s := range chunkSeeds {
		for _, m := range templateMids {
			f.Add([]byte(s), []byte(m))
		}
	}
	f.Fuzz(func(t *testing.T, first, mid []byte) {
		checkTemplate(t, first, mid)
	})
}
