package load

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// fakeEngine is an OpenEngine server written against the contract only: it streams n deltas of
// one token and "x" each, 1 ms apart, then GenerationFinished with usage; prompt "refuse" is
// answered INVALID_ARGUMENT. It keeps the request ids and API keys it saw.
type fakeEngine struct {
	oe.UnimplementedInferenceServer
	mu   sync.Mutex
	ids  []string
	keys []string
}

func (f *fakeEngine) Generate(req *oe.GenerateRequest, st grpc.ServerStreamingServer[oe.GenerateResponse]) error {
	md, _ := metadata.FromIncomingContext(st.Context())
	f.mu.Lock()
	f.ids = append(f.ids, req.GetRequestId())
	f.keys = append(f.keys, strings.Join(md.Get("authorization"), ","))
	f.mu.Unlock()
	if req.GetPrompt() == "refuse" {
		return status.Error(codes.InvalidArgument, "prompt: refused")
	}
	n := req.GetStopping().GetMaxTokens()
	zero := uint32(0)
	for i := uint32(0); i < n; i++ {
		time.Sleep(time.Millisecond)
		if err := st.Send(&oe.GenerateResponse{RequestId: req.GetRequestId(), Event: &oe.GenerateResponse_Token{Token: &oe.TokenOutput{
			OutputIndex: &zero, Tokens: []*oe.TokenInfo{{TokenId: 7}}, Text: "x"}}}); err != nil {
			return err
		}
	}
	return st.Send(&oe.GenerateResponse{RequestId: req.GetRequestId(),
		Event: &oe.GenerateResponse_Finished{Finished: &oe.GenerationFinished{OutputIndex: &zero, Reason: oe.FinishReason_FINISH_REASON_LENGTH}},
		Usage: &oe.Usage{PromptTokens: 3, CompletionTokens: n, TotalTokens: 3 + n}})
}

func startFakeEngine(t *testing.T) (*fakeEngine, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEngine{}
	srv := grpc.NewServer()
	oe.RegisterInferenceServer(srv, f)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return f, "grpc://" + ln.Addr().String()
}

// TestRunGRPC: closed and open loops over the grpc endpoint record one chunk per TokenOutput
// (TTFT and ITL come from their arrival), the server's usage and finish reason, the request
// ID sent as request_id, the API key as authorization metadata, and a refusal as the status a
// gateway maps its code to.
func TestRunGRPC(t *testing.T) {
	f, url := startFakeEngine(t)
	for _, c := range []Config{
		{Concurrency: 4, Requests: 12},
		{RequestRate: 200, Requests: 12},
	} {
		c.BaseURL, c.Model, c.APIKey, c.Endpoint, c.Stream = url, "m", "k", EndpointGRPC, true
		c.Prompts = []Prompt{{Name: "p", Prompt: "hello"}}
		c.OutputTokens = 5
		c.Warmup = 2
		res, err := Run(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Records) != 14 {
			t.Fatalf("%d records", len(res.Records))
		}
		for _, r := range res.Records {
			if r.Error != nil || r.HTTPStatus != 200 || len(r.ChunkNs) != 5 || r.OutputTokensServer != 5 || r.InputTokensServer != 3 ||
				r.FinishReason != "length" || r.ChunkNs[0] <= 0 || r.ChunkNs[4] <= r.ChunkNs[0] || r.EndNs < r.ChunkNs[4] {
				t.Errorf("record %+v", r)
			}
		}
	}
	f.mu.Lock()
	seen := map[string]bool{}
	for i, id := range f.ids {
		if id == "" || seen[id] || f.keys[i] != "Bearer k" {
			t.Errorf("request %d: id %q (dup %v), authorization %q", i, id, seen[id], f.keys[i])
		}
		seen[id] = true
	}
	f.mu.Unlock()

	res, err := Run(context.Background(), Config{BaseURL: url, Endpoint: EndpointGRPC, Stream: true, Concurrency: 1, Requests: 2,
		Prompts: []Prompt{{Name: "bad", Prompt: "refuse"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		if r.Error == nil || r.HTTPStatus != 400 || r.Error.Type != "InvalidArgument" || !strings.Contains(r.Error.Message, "prompt") {
			t.Errorf("refused request recorded as %+v", r)
		}
	}
}

func TestGRPCRequestRefusesUnknownExtra(t *testing.T) {
	_, err := grpcRequest(&Config{Extra: map[string]any{"logprobs": 1}}, Prompt{Prompt: "x"}, 4)
	if err == nil || !strings.Contains(err.Error(), "logprobs") {
		t.Errorf("Extra logprobs: %v", err)
	}
	b, err := grpcRequest(&Config{Model: "m", Extra: map[string]any{"temperature": 0.5, "seed": 3}}, Prompt{Prompt: "x"}, 4)
	if err != nil || len(b) == 0 {
		t.Fatalf("temperature and seed: %v", err)
	}
	if _, err := grpcTarget("http://h:1/v1"); err == nil {
		t.Error("an http URL was taken as a gRPC target")
	}
}
