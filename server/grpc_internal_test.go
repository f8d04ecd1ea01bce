package server

import (
	"bytes"
	"math"
	"regexp"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// TestTokenEventEncoding: the hand encoder writes the bytes proto.Marshal writes for the same
// GenerateResponse, and they decode back to it (the independent reference is the protobuf
// library).
func TestTokenEventEncoding(t *testing.T) {
	for _, c := range []struct {
		id   string
		toks []int32
		text string
	}{
		{"", nil, ""},
		{"r1", []int32{5}, "a"},
		{"req-" + string(bytes.Repeat([]byte("x"), 150)), []int32{0, 1, 127, 128, 16383, 16384, 151643, math.MaxInt32}, "héllo wörld"},
		{"r2", []int32{0}, ""},
		{"r3", nil, string(bytes.Repeat([]byte("z"), 300))},
	} {
		zero := uint32(0)
		want := &oe.GenerateResponse{RequestId: c.id, Event: &oe.GenerateResponse_Token{Token: &oe.TokenOutput{OutputIndex: &zero, Text: c.text}}}
		for _, tk := range c.toks {
			want.GetToken().Tokens = append(want.GetToken().Tokens, &oe.TokenInfo{TokenId: uint32(tk)})
		}
		wantB, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		f := encodeTokenEvent(c.id, c.toks, []byte(c.text))
		got := f.buf.ReadOnlyData()
		if !bytes.Equal(got, wantB) {
			t.Errorf("%q %v %q:\n got % x\nwant % x", c.id, c.toks, c.text, got, wantB)
		}
		back := &oe.GenerateResponse{}
		if err := proto.Unmarshal(got, back); err != nil || !proto.Equal(back, want) {
			t.Errorf("decode back: %v %v", back, err)
		}
		f.buf.Free()
	}
}

func TestInvalidUTF8Field(t *testing.T) {
	stop := &oe.GenerateRequest{Stopping: &oe.StoppingOptions{Conditions: []*oe.StopCondition{
		{Condition: &oe.StopCondition_StopText{StopText: "ok"}}, {Condition: &oe.StopCondition_StopText{StopText: "XX"}}}}}
	b, _ := proto.Marshal(stop)
	b = bytes.Replace(b, []byte("XX"), []byte{'X', 0xff}, 1)
	if got := invalidUTF8Field(b); got != "stopping.conditions.stop_text" {
		t.Errorf("stop text: %q", got)
	}
	p, _ := proto.Marshal(&oe.GenerateRequest{RequestId: "id", Input: &oe.GenerateRequest_Prompt{Prompt: "aYb"}})
	p = bytes.Replace(p, []byte("aYb"), []byte{'a', 0xc3, 'b'}, 1)
	if got := invalidUTF8Field(p); got != "prompt" {
		t.Errorf("prompt: %q", got)
	}
	if proto.Unmarshal(p, &oe.GenerateRequest{}) == nil {
		t.Error("proto.Unmarshal accepted invalid UTF-8: the field finder would never run")
	}
}

var fieldFirst = regexp.MustCompile(`^[a-z_]+(\[[0-9]+\])?(\.[a-z_]+(\[[0-9]+\])?)*: `)

// FuzzMapGenerateRequest: any GenerateRequest maps without panicking to either a GenRequest
// within the HTTP path's bounds or a refusal that is INVALID_ARGUMENT or UNIMPLEMENTED and
// starts with the field it is about.
func FuzzMapGenerateRequest(f *testing.F) {
	d := func(v float64) *float64 { return &v }
	u := func(v uint32) *uint32 { return &v }
	i := func(v int32) *int32 { return &v }
	yes := true
	extra, _ := structpb.NewStruct(map[string]any{"knob": 1})
	for _, r := range []*oe.GenerateRequest{
		{Input: &oe.GenerateRequest_Prompt{Prompt: "hello"}},
		{RequestId: "a", Model: "m", Input: &oe.GenerateRequest_TokenIds{TokenIds: &oe.TokenIds{Ids: []uint32{1, 2, 3}}},
			Sampling: &oe.SamplingParams{Temperature: d(0.7), TopP: d(0.9), TopK: i(40), Seed: proto.Uint64(7)},
			Stopping: &oe.StoppingOptions{MaxTokens: u(16), IgnoreEos: &yes, Conditions: []*oe.StopCondition{
				{Condition: &oe.StopCondition_StopText{StopText: "\n"}}, {Condition: &oe.StopCondition_StopTokenId{StopTokenId: 50256}}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Sampling: &oe.SamplingParams{Temperature: d(math.NaN()), NumSequences: u(2)}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{ReturnOutputLogprobs: &yes,
			OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 5}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{ReturnOutputLogprobs: &yes}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{
			OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 3}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{ReturnOutputLogprobs: &yes,
			OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: 21}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{ReturnOutputLogprobs: &yes,
			OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_All{All: &oe.AllCandidates{}}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Response: &oe.ResponseOptions{ReturnPromptLogprobs: &yes}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Stopping: &oe.StoppingOptions{IncludeStopInOutput: &yes,
			Conditions: []*oe.StopCondition{{Condition: &oe.StopCondition_StopText{StopText: "."}}}}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Extra: extra, Stopping: &oe.StoppingOptions{MaxTokens: u(0)}},
		{Input: &oe.GenerateRequest_Prompt{Prompt: "x"}, Guided: &oe.GuidedDecoding{Guide: &oe.GuidedDecoding_JsonObject{}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &oe.GenerateRequest{}
		if proto.Unmarshal(b, req) != nil {
			if f := invalidUTF8Field(b); f != "" && !fieldFirst.MatchString(f+": ") {
				t.Fatalf("field name %q", f)
			}
			return
		}
		g, o, err := mapGenerateRequest(req)
		if err != nil {
			st, ok := status.FromError(err)
			if !ok || (st.Code() != codes.InvalidArgument && st.Code() != codes.Unimplemented) {
				t.Fatalf("refusal %v is not INVALID_ARGUMENT or UNIMPLEMENTED", err)
			}
			if !fieldFirst.MatchString(st.Message()) {
				t.Fatalf("refusal %q does not start with the field", st.Message())
			}
			return
		}
		switch {
		case g.HasPromptIDs == (g.Prompt != ""):
			t.Fatalf("exactly one input must be set: %+v", g)
		case !g.HasPromptIDs && !utf8.ValidString(g.Prompt):
			t.Fatal("invalid UTF-8 prompt accepted")
		case g.HasPromptIDs && len(g.PromptIDs) == 0:
			t.Fatal("empty token ids accepted")
		case math.IsNaN(g.Temperature) || g.Temperature < 0 || g.Temperature > 2:
			t.Fatalf("temperature %v", g.Temperature)
		case math.IsNaN(g.TopP) || g.TopP <= 0 || g.TopP > 1:
			t.Fatalf("top_p %v", g.TopP)
		case g.TopK < 0 || g.MaxTokens < 0 || o.maxTokSet && g.MaxTokens == 0:
			t.Fatalf("top_k %d max_tokens %d", g.TopK, g.MaxTokens)
		case len(g.Stop) > MaxStopStrings || len(o.stopIDs) > MaxStopTokenIDs:
			t.Fatalf("%d stop texts, %d stop ids", len(g.Stop), len(o.stopIDs))
		case g.TopLogprobs < 0 || g.TopLogprobs > MaxTopLogprobs || g.TopLogprobs > 0 && !g.Logprobs:
			t.Fatalf("logprobs %v with %d candidates", g.Logprobs, g.TopLogprobs)
		}
		for _, id := range append(append([]int32{}, g.PromptIDs...), o.stopIDs...) {
			if id < 0 {
				t.Fatalf("negative token id %d", id)
			}
		}
		for _, s := range g.Stop {
			if s == "" || !utf8.ValidString(s) {
				t.Fatalf("stop text %q", s)
			}
		}
	})
}
