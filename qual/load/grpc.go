package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/modelqual/modelqual/qual/client"
	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// EndpointGRPC is Config.Endpoint for an OpenEngine API v1 server (openengine.v1.Inference
// Generate, a server stream of token deltas): qual-server's --grpc-port or any other
// OpenEngine engine. Config.BaseURL is then grpc://host:port. Each request is one Generate;
// its record has the same fields as an HTTP stream's: TTFT and ITL from the arrival of each
// TokenOutput, usage from the final response, and a status a gateway maps the gRPC code to
// (OK 200, INVALID_ARGUMENT 400, RESOURCE_EXHAUSTED 429, ...), so joins and exports read alike.
const EndpointGRPC = "grpc"

// grpcClient sends a run's requests over one ClientConn (gRPC multiplexes the run's streams on
// it, as gRPC clients do).
type grpcClient struct {
	conn   *grpc.ClientConn
	inf    oe.InferenceClient
	apiKey string
}

// grpcTarget turns grpc://host:port (or host:port) into a dial target.
func grpcTarget(base string) (string, error) {
	t := strings.TrimPrefix(base, "grpc://")
	if t == "" || strings.Contains(t, "/") {
		return "", fmt.Errorf("load.Run: Config.BaseURL %q: the grpc endpoint takes grpc://host:port", base)
	}
	return t, nil
}

func newGRPCClient(cfg *Config) (*grpcClient, error) {
	target, err := grpcTarget(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("load.Run: grpc client for %s: %w", target, err)
	}
	return &grpcClient{conn: conn, inf: oe.NewInferenceClient(conn), apiKey: cfg.APIKey}, nil
}

// grpcRequest builds one prompt's GenerateRequest (without its request_id, set per request).
// Extra carries the sampling fields of the HTTP bodies (temperature, top_p, top_k, seed);
// anything else is refused by name rather than dropped.
func grpcRequest(cfg *Config, p Prompt, maxTokens int) ([]byte, error) {
	if p.Prompt == "" {
		return nil, errors.New("the grpc endpoint sends text prompts; this prompt has none")
	}
	req := &oe.GenerateRequest{Model: cfg.Model, Input: &oe.GenerateRequest_Prompt{Prompt: p.Prompt}}
	if maxTokens > 0 {
		n, yes := uint32(maxTokens), true
		req.Stopping = &oe.StoppingOptions{MaxTokens: &n, IgnoreEos: &yes}
	}
	for k, v := range cfg.Extra {
		if req.Sampling == nil {
			req.Sampling = &oe.SamplingParams{}
		}
		f, ok := toFloat(v)
		if !ok {
			return nil, fmt.Errorf("Extra[%q] = %v: the grpc endpoint takes numbers for sampling fields", k, v)
		}
		switch k {
		case "temperature":
			req.Sampling.Temperature = &f
		case "top_p":
			req.Sampling.TopP = &f
		case "top_k":
			k := int32(f)
			req.Sampling.TopK = &k
		case "seed":
			s := uint64(f)
			req.Sampling.Seed = &s
		default:
			return nil, fmt.Errorf("Extra[%q]: the grpc endpoint maps temperature, top_p, top_k and seed only", k)
		}
	}
	return proto.Marshal(req)
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case json.Number: // --extra-body keeps numbers as written
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}

var finishNames = map[oe.FinishReason]string{
	oe.FinishReason_FINISH_REASON_STOP: "stop", oe.FinishReason_FINISH_REASON_LENGTH: "length",
	oe.FinishReason_FINISH_REASON_CANCELLED: "cancelled",
}

// do sends one Generate (body: a marshaled GenerateRequest without request_id) and measures it
// into resp the way client.Do measures an SSE stream.
func (g *grpcClient) do(ctx context.Context, epoch time.Time, timeout time.Duration, req *client.Request, resp *client.Response) {
	resp.Reset()
	resp.RequestID = req.ID
	msg := &oe.GenerateRequest{}
	if err := proto.Unmarshal(req.Body, msg); err != nil {
		resp.Err = &client.Error{Type: "ClientError", Message: "decode prebuilt request: " + err.Error()}
		return
	}
	msg.RequestId = req.ID
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, timeout)
		defer c2()
	}
	md := []string{"x-request-id", req.ID}
	if g.apiKey != "" {
		md = append(md, "authorization", "Bearer "+g.apiKey)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	resp.StartNs = int64(time.Since(epoch))
	resp.StartUnixNs = epoch.UnixNano() + resp.StartNs
	cancelled := make(chan int64, 1)
	if req.CancelAfter > 0 {
		t := time.AfterFunc(req.CancelAfter, func() { cancelled <- int64(time.Since(epoch)); cancel() })
		defer t.Stop()
	}
	end := func(err error) {
		resp.EndNs = int64(time.Since(epoch))
		if err == nil {
			resp.Status = http.StatusOK
			return
		}
		st, _ := status.FromError(err)
		select {
		case at := <-cancelled:
			resp.Cancelled, resp.CancelNs = true, at
		default:
			if ctx.Err() != nil && st.Code() == codes.Canceled {
				resp.Cancelled, resp.CancelNs = true, resp.EndNs
			}
		}
		resp.Status = oe.HTTPStatus(st.Code())
		resp.Err = &client.Error{Code: resp.Status, Type: st.Code().String(), Message: st.Message()}
	}
	st, err := g.inf.Generate(ctx, msg)
	if err != nil {
		end(err)
		return
	}
	ev := &oe.GenerateResponse{}
	for {
		ev.Reset()
		err := st.RecvMsg(ev)
		now := int64(time.Since(epoch))
		if err == io.EOF {
			end(nil)
			return
		}
		if err != nil {
			end(err)
			return
		}
		if resp.AckNs == 0 {
			resp.AckNs = now
		}
		resp.ResponseBytes += int64(proto.Size(ev))
		switch e := ev.GetEvent().(type) {
		case *oe.GenerateResponse_Token:
			if len(e.Token.GetTokens()) > 0 || e.Token.GetText() != "" {
				resp.ChunkNs = append(resp.ChunkNs, now)
				resp.Text = append(resp.Text, e.Token.GetText()...)
			}
		case *oe.GenerateResponse_Finished:
			resp.FinishReason = finishNames[e.Finished.GetReason()]
		case *oe.GenerateResponse_Error:
			resp.Err = &client.Error{Code: http.StatusInternalServerError, Type: e.Error.GetCode().String(), Message: e.Error.GetMessage()}
			resp.FinishReason = "error"
		}
		if u := ev.GetUsage(); u != nil {
			resp.HasUsage, resp.PromptTokens, resp.CompletionTokens = true, int(u.GetPromptTokens()), int(u.GetCompletionTokens())
		}
		if resp.Err != nil {
			resp.EndNs = now
			resp.Status = http.StatusOK // the call itself succeeded; the stream carried the error
			for st.RecvMsg(ev) == nil {
			}
			return
		}
	}
}

// grpcGenerateRoute is the route of qual-server's records of Generate calls (the gRPC method).
const grpcGenerateRoute = "/openengine.v1.Inference/Generate"
