package spec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/modelqual/modelqual/qual/launch"
	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// GRPCParityInput is the input of GRPCParity and CheckGRPCParity.
type GRPCParityInput struct {
	// API reaches the server's HTTP routes; GRPCAddr (host:port) the same server's OpenEngine
	// v1 gRPC port.
	API      *API
	GRPCAddr string
	// Corpus: the raw-text prompts are sent (the gRPC API takes text or token ids, not chat).
	Corpus []Prompt
	// EOSPrompts are token-id prompts whose greedy continuation reaches the model's own EOS
	// (the family's EOS golden, when it has one): sent as token ids on both APIs, so a natural
	// EOS is compared on all three paths.
	EOSPrompts []EOSPrompt
	// MaxTokens per answer. EOS is not ignored, so an answer that ends at the model's own EOS
	// before MaxTokens is compared too (finish reason stop on all three paths).
	MaxTokens int
}

// EOSPrompt is a named token-id prompt.
type EOSPrompt struct {
	Name string
	IDs  []int32
}

// GRPCAnswer is one Generate stream as a client reads it.
type GRPCAnswer struct {
	Text             string
	TokenIDs         []uint32
	Deltas           int
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
	HasUsage         bool
	// Logprobs, when asked for: each token's text, logprob and candidates (TokenInfo).
	Logprobs []TokenLogprob
}

// GenerateGRPC streams one greedy Generate of prompt (text, or token ids when ids is not nil)
// on conn; with topN >= 0 it asks for output logprobs with topN candidates.
func GenerateGRPC(ctx context.Context, conn *grpc.ClientConn, model, prompt string, ids []int32, maxTokens, topN int) (*GRPCAnswer, error) {
	temp, n := 0.0, uint32(maxTokens)
	req := &oe.GenerateRequest{Model: model, Input: &oe.GenerateRequest_Prompt{Prompt: prompt},
		Sampling: &oe.SamplingParams{Temperature: &temp}, Stopping: &oe.StoppingOptions{MaxTokens: &n}}
	if topN >= 0 {
		yes := true
		req.Response = &oe.ResponseOptions{ReturnOutputLogprobs: &yes,
			OutputCandidates: &oe.CandidateTokenSelection{Selection: &oe.CandidateTokenSelection_TopN{TopN: uint32(topN)}}}
	}
	if ids != nil {
		u := make([]uint32, len(ids))
		for i, id := range ids {
			u[i] = uint32(id)
		}
		req.Input = &oe.GenerateRequest_TokenIds{TokenIds: &oe.TokenIds{Ids: u}}
	}
	return GenerateGRPCRequest(ctx, conn, req, topN)
}

// GenerateGRPCRequest streams one Generate of req and reads it as GenerateGRPC does (topN >= 0:
// the request asked for output logprobs).
func GenerateGRPCRequest(ctx context.Context, conn *grpc.ClientConn, req *oe.GenerateRequest, topN int) (*GRPCAnswer, error) {
	st, err := oe.NewInferenceClient(conn).Generate(ctx, req)
	if err != nil {
		return nil, err
	}
	a := &GRPCAnswer{}
	names := map[oe.FinishReason]string{oe.FinishReason_FINISH_REASON_STOP: "stop", oe.FinishReason_FINISH_REASON_LENGTH: "length",
		oe.FinishReason_FINISH_REASON_CANCELLED: "cancelled"}
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			return a, nil
		}
		if err != nil {
			return a, err
		}
		switch e := ev.GetEvent().(type) {
		case *oe.GenerateResponse_Token:
			a.Deltas++
			a.Text += e.Token.GetText()
			for _, ti := range e.Token.GetTokens() {
				a.TokenIDs = append(a.TokenIDs, ti.GetTokenId())
				if topN >= 0 {
					tl := TokenLogprob{Token: ti.GetToken(), Logprob: math.NaN(), ID: int32(ti.GetTokenId())}
					if ti.Logprob != nil {
						tl.Logprob = ti.GetLogprob()
					}
					for _, c := range ti.GetCandidates() {
						tl.Top = append(tl.Top, TopLogprob{Token: c.GetToken(), Logprob: c.GetLogprob(), ID: int32(c.GetTokenId())})
					}
					a.Logprobs = append(a.Logprobs, tl)
				}
			}
		case *oe.GenerateResponse_Finished:
			a.FinishReason = names[e.Finished.GetReason()]
		case *oe.GenerateResponse_Error:
			return a, fmt.Errorf("engine error %v: %s", e.Error.GetCode(), e.Error.GetMessage())
		}
		if u := ev.GetUsage(); u != nil {
			a.HasUsage, a.PromptTokens, a.CompletionTokens = true, int(u.GetPromptTokens()), int(u.GetCompletionTokens())
		}
	}
}

// CheckGRPCParity is GRPCParity's core: at temperature 0, for every raw-text corpus prompt, the
// gRPC stream (OpenEngine v1 Generate), the HTTP non-streaming completion and the HTTP stream
// agree on the text, the finish reason and the usage; the gRPC stream's token ids number its
// completion tokens and its deltas are never cumulative; every path carries logprobs (5
// alternatives) for every completion token, the streams' equal to the non-streamed answer's
// (token, float32 logprob, alternatives, each named by its id). Prompt logprobs, not offered, are refused by
// name on gRPC.
func CheckGRPCParity(ctx context.Context, in GRPCParityInput) error {
	const fn = "spec.CheckGRPCParity"
	switch {
	case in.API == nil || in.GRPCAddr == "":
		return fmt.Errorf("%s: GRPCParityInput.API and GRPCAddr are required", fn)
	case in.MaxTokens < 1:
		return fmt.Errorf("%s: GRPCParityInput.MaxTokens %d must be at least 1", fn, in.MaxTokens)
	}
	conn, err := grpc.NewClient(in.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("%s: %w", fn, err)
	}
	defer conn.Close()
	var problems []string
	var compared, naturalEOS int
	type item struct {
		name, text string
		ids        []int32
	}
	var items []item
	for _, p := range in.Corpus {
		if !p.IsChat() {
			items = append(items, item{name: p.Name, text: p.Prompt})
		}
	}
	for _, p := range in.EOSPrompts {
		items = append(items, item{name: p.Name, ids: p.IDs})
	}
	for _, p := range items {
		compared++
		// return_tokens_as_token_ids names each token and alternative by its id ("token_id:N"),
		// as gRPC's TokenInfo does, so ids that share a text stay apart.
		body := map[string]any{"prompt": p.text, "max_tokens": in.MaxTokens, "temperature": 0, "logprobs": parityTopN,
			"return_tokens_as_token_ids": true}
		if p.ids != nil {
			body["prompt"] = p.ids
		}
		whole, err := in.API.Complete(ctx, "/v1/completions", body)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: HTTP non-streaming: %v", p.name, err))
			continue
		}
		sb := map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
		for k, v := range body {
			sb[k] = v
		}
		streamed, err := in.API.Complete(ctx, "/v1/completions", sb)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: HTTP streaming: %v", p.name, err))
			continue
		}
		g, err := GenerateGRPC(ctx, conn, in.API.Model, p.text, p.ids, in.MaxTokens, parityTopN)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: gRPC Generate: %v", p.name, err))
			continue
		}
		g.Logprobs = namedByID(g.Logprobs)
		if whole.FinishReason == "stop" {
			naturalEOS++
		}
		for _, c := range []struct {
			what      string
			text, fin string
			pt, ct    int
			has       bool
		}{{"HTTP stream", streamed.Text, streamed.FinishReason, streamed.PromptTokens, streamed.CompletionTokens, streamed.HasUsage},
			{"gRPC stream", g.Text, g.FinishReason, g.PromptTokens, g.CompletionTokens, g.HasUsage}} {
			if c.text != whole.Text {
				problems = append(problems, fmt.Sprintf("prompt %q: %s text %q, HTTP non-streaming %q", p.name, c.what, clip(c.text, 60), clip(whole.Text, 60)))
			}
			if c.fin != whole.FinishReason {
				problems = append(problems, fmt.Sprintf("prompt %q: %s finish %q, HTTP non-streaming %q", p.name, c.what, c.fin, whole.FinishReason))
			}
			if !c.has || c.pt != whole.PromptTokens || c.ct != whole.CompletionTokens {
				problems = append(problems, fmt.Sprintf("prompt %q: %s usage %d+%d (present %v), HTTP non-streaming %d+%d",
					p.name, c.what, c.pt, c.ct, c.has, whole.PromptTokens, whole.CompletionTokens))
			}
		}
		// Deltas are never cumulative: their token ids add up to the completion tokens (and
		// their texts, compared above, concatenate to the answer).
		if len(g.TokenIDs) != g.CompletionTokens {
			problems = append(problems, fmt.Sprintf("prompt %q: gRPC deltas carry %d token ids for %d completion tokens",
				p.name, len(g.TokenIDs), g.CompletionTokens))
		}
		// Logprobs: one entry per completion token on every path (the EOS that ended an answer
		// included), the streams' equal to the non-streamed answer's.
		for _, c := range []struct {
			what string
			lps  []TokenLogprob
		}{{"HTTP non-streaming", whole.Logprobs}, {"HTTP stream", streamed.Logprobs}, {"gRPC stream", g.Logprobs}} {
			if len(c.lps) != whole.CompletionTokens {
				problems = append(problems, fmt.Sprintf("prompt %q: %s carries logprobs for %d tokens, %d completion tokens", p.name, c.what, len(c.lps), whole.CompletionTokens))
				continue
			}
			if c.what != "HTTP non-streaming" {
				if d := logprobsDiff(whole.Logprobs, c.lps); d != "" {
					problems = append(problems, fmt.Sprintf("prompt %q: %s logprobs differ from HTTP non-streaming: %s", p.name, c.what, d))
				}
			}
		}
	}
	if compared == 0 {
		return fmt.Errorf("%s: the corpus has no raw-text prompt", fn)
	}
	if len(in.EOSPrompts) > 0 && naturalEOS == 0 {
		problems = append(problems, fmt.Sprintf("none of the %d EOS prompts ended at the model's EOS (finish_reason stop)", len(in.EOSPrompts)))
	}
	// Prompt logprobs: not offered; gRPC must say so by name rather than omit them.
	yes := true
	n := uint32(1)
	st, err := oe.NewInferenceClient(conn).Generate(ctx, &oe.GenerateRequest{Input: &oe.GenerateRequest_Prompt{Prompt: "x"},
		Stopping: &oe.StoppingOptions{MaxTokens: &n}, Response: &oe.ResponseOptions{ReturnPromptLogprobs: &yes}})
	if err == nil {
		_, err = st.Recv()
	}
	if s, _ := status.FromError(err); s.Code() != codes.Unimplemented || !strings.Contains(s.Message(), "return_prompt_logprobs") {
		problems = append(problems, fmt.Sprintf("gRPC return_prompt_logprobs: got %v, want UNIMPLEMENTED naming the field", err))
	}
	ginkgo.GinkgoWriter.Printf("gRPC parity: %d prompts compared, %d ended at the model's own EOS\n", compared, naturalEOS)
	if len(problems) > 0 {
		return errors.New("gRPC parity gate:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// parityTopN is the alternatives per token the gRPC parity gate asks on every path.
const parityTopN = 5

// logprobsDiff compares two paths' logprobs of the same tokens: token text, logprob (as the
// engine's float32) and the alternatives (each of b's must be a's with the same value; a's
// completions dict may add the chosen token). "" when they agree.
func logprobsDiff(a, b []TokenLogprob) string {
	f := func(x float64) float32 { return float32(x) }
	for i := range a {
		x, y := a[i], b[i]
		if x.Token != y.Token || f(x.Logprob) != f(y.Logprob) {
			return fmt.Sprintf("token %d: %q %v vs %q %v", i, x.Token, x.Logprob, y.Token, y.Logprob)
		}
		// The completions dict adds the chosen token when it is not among the alternatives.
		if nx, ny := len(x.Top), len(y.Top); nx != ny && nx+1 != ny && ny+1 != nx {
			return fmt.Sprintf("token %d: %d alternatives vs %d", i, len(x.Top), len(y.Top))
		}
		small, big := y.Top, x.Top
		if len(small) > len(big) {
			small, big = big, small
		}
		for _, c := range small {
			found := false
			for _, d := range big {
				if d.Token == c.Token && f(d.Logprob) == f(c.Logprob) {
					found = true
					break
				}
			}
			if !found {
				return fmt.Sprintf("token %d: alternative %q %v not among %v", i, c.Token, c.Logprob, big)
			}
		}
	}
	return ""
}

// namedByID names every token and alternative of lps "token_id:<id>", as an OpenAI-compatible
// answer does under return_tokens_as_token_ids.
func namedByID(lps []TokenLogprob) []TokenLogprob {
	out := make([]TokenLogprob, len(lps))
	for i, t := range lps {
		out[i] = TokenLogprob{Token: fmt.Sprintf("token_id:%d", t.ID), Logprob: t.Logprob, ID: t.ID}
		for _, c := range t.Top {
			out[i].Top = append(out[i].Top, TopLogprob{Token: fmt.Sprintf("token_id:%d", c.ID), Logprob: c.Logprob, ID: c.ID})
		}
	}
	return out
}

// GRPCParity asserts CheckGRPCParity on a server of the suite's bundle started with
// --grpc-port (input starts it; see Suite.GRPCParityInput).
func GRPCParity(ctx context.Context, input func() GRPCParityInput) {
	ginkgo.It("streams OpenEngine gRPC answers equal to the HTTP non-streaming and streaming ones", Gate(GateParity), Task(TaskGRPC), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		gomega.Expect(CheckGRPCParity(c, input())).To(gomega.Succeed())
	})
}

// GRPCParityInput starts a CPU server of the suite's bundle with --grpc-port (the suite's own
// server has no gRPC port) for the calling spec, and returns the gate's input over the suite's
// corpus with EOS honoured (MaxTokens: twice the greedy steps, so short answers end at EOS
// when the model produces one). Under the container and GPU launchers the spec skips: the
// gate runs in premerge, on the process launcher.
func (s *Suite) GRPCParityInput() GRPCParityInput {
	ginkgo.GinkgoHelper()
	if s.State.Bundle == "" || s.State.Launcher != "process" || s.State.Device == "cuda" {
		ginkgo.Skip(fmt.Sprintf("%sthe gRPC parity gate starts its own CPU server of the suite's bundle; this run uses the %s launcher", NotCheckable, s.State.Launcher))
	}
	api, addr, _ := s.startGRPCServer("grpc-parity")
	in := GRPCParityInput{API: api, GRPCAddr: addr, Corpus: s.Corpus, MaxTokens: 2 * s.Threshold().GreedySteps}
	eosPath := filepath.Join(s.State.RepoRoot, "fixtures", "golden", s.goldenFixture()+"-eos.json")
	if _, err := os.Stat(eosPath); err == nil {
		g, err := LoadEOSGolden(eosPath)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		for _, p := range g.Prompts {
			in.EOSPrompts = append(in.EOSPrompts, EOSPrompt{Name: p.Name, IDs: p.PromptIDs})
		}
	}
	return in
}

// startGRPCServer starts a CPU server of the suite's bundle with --grpc-port for the calling
// spec (stopped when it ends), with the suite's server settings (MODELQUAL_FAULTS included, so
// a planted server fault such as server.grpc_cumulative_deltas reaches this server too), and
// returns its HTTP API, its gRPC address and its endpoint (whose records file it writes).
func (s *Suite) startGRPCServer(name string) (*API, string, *launch.Endpoint) {
	ginkgo.GinkgoHelper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	opts := append(s.serverOptions(filepath.Join(s.State.Artifacts, "servers", name)),
		launch.WithBundle(s.State.Bundle), launch.WithModel(s.State.Model),
		launch.WithServerBin(filepath.Join(binDir(s.State.RepoRoot), "qual-server")),
		launch.WithArgs("--grpc-port", strconv.Itoa(port)))
	l := launch.Process(opts...)
	ep, err := l.Start(context.Background())
	if ep != nil {
		ginkgo.DeferCleanup(func(ctx context.Context) error { return ep.Stop(ctx) }, ginkgo.NodeTimeout(time.Minute))
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "start a server with --grpc-port")
	return NewAPI(ep.BaseURL, ep.Model, "", s.Manifest.Server.RequestTimeout.Duration), fmt.Sprintf("127.0.0.1:%d", port), ep
}
