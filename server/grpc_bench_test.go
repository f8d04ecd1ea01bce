package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	oe "github.com/modelqual/modelqual/server/openengine/v1"
)

// countingConn counts the bytes a client reads off the wire (TCP payload: HTTP/1.1 chunking and
// headers for SSE, HTTP/2 frames for gRPC), the figure both transports are compared on.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func countingDialer(n *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, n}, nil
	}
}

// grpcStreamTokens runs one Generate and counts the token ids its deltas carry and the bytes of
// its messages (their protobuf encoding, without gRPC and HTTP/2 framing).
func grpcStreamTokens(tb testing.TB, inf oe.InferenceClient, req *oe.GenerateRequest) (tokens int, msgBytes int) {
	st, err := inf.Generate(context.Background(), req)
	if err != nil {
		tb.Error(err)
		return 0, 0
	}
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			return tokens, msgBytes
		}
		if err != nil {
			tb.Error(err)
			return tokens, msgBytes
		}
		msgBytes += proto.Size(ev)
		if t := ev.GetToken(); t != nil {
			tokens += len(t.GetTokens())
		}
	}
}

// costWindow measures the frontend's, the workers' and this process's CPU and the bytes read
// off the wire over one run of fn, per token fn reports.
func costWindow(b *testing.B, s *testServer, wire *atomic.Int64, fn func() int) {
	pids := s.workerPIDs(b)
	fe0, cl0, w0 := cpuTicks(b, s.cmd.Process.Pid), cpuTicks(b, os.Getpid()), wire.Load()
	var wk0 int64
	for _, p := range pids {
		wk0 += cpuTicks(b, p)
	}
	b.ResetTimer()
	start := time.Now()
	tokens := fn()
	el := time.Since(start)
	b.StopTimer()
	fe, cl := cpuTicks(b, s.cmd.Process.Pid)-fe0, cpuTicks(b, os.Getpid())-cl0
	var wk int64
	for _, p := range pids {
		wk += cpuTicks(b, p)
	}
	wk -= wk0
	if tokens == 0 {
		b.Fatal("no tokens streamed")
	}
	us := 1e6 / clkTck / float64(tokens)
	b.ReportMetric(float64(fe)*us, "frontend_us/token")
	b.ReportMetric(float64(wk)*us, "worker_us/token")
	b.ReportMetric(float64(cl)*us, "client_us/token")
	b.ReportMetric(float64(wire.Load()-w0)/float64(tokens), "wire_bytes/token")
	b.ReportMetric(float64(tokens)/el.Seconds(), "tokens/s")
	b.ReportMetric(0, "ns/op")
}

// fanOut runs total calls of one over conc goroutines and sums what they return.
func fanOut(conc, total int, one func() int) int {
	next := make(chan struct{}, total)
	for i := 0; i < total; i++ {
		next <- struct{}{}
	}
	close(next)
	var sum atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				sum.Add(int64(one()))
			}
		}()
	}
	wg.Wait()
	return int(sum.Load())
}

// BenchmarkStreamCostC32 is the seed's figure (../shared/seeds/, the TensorRT-LLM gRPC
// frontend study: 88-110 us of frontend CPU per token at concurrency 32 on a CPU engine mock):
// one qual-server with the mock engine (one token per step, no delay) serving SSE on its HTTP
// port and OpenEngine gRPC on --grpc-port, 32 concurrent streams of 256 tokens each, the two
// transports side by side in one run. b.N is the number of requests. The SSE client is 32
// HTTP/1.1 connections (one stream each at a time); the gRPC client is one ClientConn with
// the 32 streams multiplexed on it, as gRPC clients are written. Metrics: CPU per streamed
// token of the frontend, the worker and this process (the load generator), bytes read off
// the wire per token, tokens/s. `make bench-grpc` runs it.
//
// step=0 runs the engine as fast as it goes, so a frontend wake-up finds several steps' tokens
// (SSE writes one event per token, gRPC one TokenOutput per wake-up holding them all); step=1ms
// paces the engine so that every delta of both carries one token, the seed's shape.
func BenchmarkStreamCostC32(b *testing.B) {
	for _, step := range []time.Duration{0, time.Millisecond} {
		b.Run("step="+step.String(), func(b *testing.B) { streamCost(b, step) })
	}
}

func streamCost(b *testing.B, step time.Duration) {
	const conc, maxTok = 32, 256
	gp := freePort(b)
	s := sharedServer(b, mockBundle(b, step), "--max-batch", "32", "--queue-depth", "64", "--grpc-port", fmt.Sprint(gp))
	b.Run("sse", func(b *testing.B) {
		var wire atomic.Int64
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc * 2, DisableCompression: true, DialContext: countingDialer(&wire)}}
		body := fmt.Sprintf(`{"prompt":"Hello world","max_tokens":%d,"ignore_eos":true,"stream":true}`, maxTok)
		readers := sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}
		one := func() int {
			r := readers.Get().(*bufio.Reader)
			defer readers.Put(r)
			return streamOnce(b, client, s.url, body, r).tokens
		}
		fanOut(conc, conc, one) // warm up: one request per connection
		costWindow(b, s, &wire, func() int { return fanOut(conc, max(b.N, conc), one) })
	})
	b.Run("grpc", func(b *testing.B) {
		var wire atomic.Int64
		conn, err := grpc.NewClient(s.grpcAddr(gp), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return countingDialer(&wire)(ctx, "tcp", addr)
		}))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		inf := oe.NewInferenceClient(conn)
		n, yes := uint32(maxTok), true
		req := &oe.GenerateRequest{Input: &oe.GenerateRequest_Prompt{Prompt: "Hello world"}, Stopping: &oe.StoppingOptions{MaxTokens: &n, IgnoreEos: &yes}}
		one := func() int { t, _ := grpcStreamTokens(b, inf, req); return t }
		fanOut(conc, conc, one)
		costWindow(b, s, &wire, func() int { return fanOut(conc, max(b.N, conc), one) })
	})
}

func (s *testServer) grpcAddr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// TestGRPCDeltaBytesFlat is the seed's regression as a gate: the message bytes a client reads
// per token must not grow with the output length (message bytes, not wire bytes: HTTP/2
// pings and window updates depend on time, not on the output). The real frontend sends each delta once (flat);
// with the regression planted (fault server.grpc_cumulative_deltas: every update repeats the
// whole text so far) the bytes per token of a 512-token stream are several times those of a
// 64-token stream. Bytes, not time, so the gate is deterministic.
func TestGRPCDeltaBytesFlat(t *testing.T) {
	perToken := func(fault string) (short, long float64) {
		t.Setenv("MODELQUAL_FAULTS", fault)
		gp := freePort(t)
		// 1 ms a step: each delta carries one token, as at the seed's concurrency.
		s := startServer(t, mockBundle(t, time.Millisecond), "--grpc-port", fmt.Sprint(gp))
		conn, err := grpc.NewClient(s.grpcAddr(gp), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		inf := oe.NewInferenceClient(conn)
		measure := func(n uint32) float64 {
			yes := true
			req := &oe.GenerateRequest{Input: &oe.GenerateRequest_Prompt{Prompt: "Hello"}, Stopping: &oe.StoppingOptions{MaxTokens: &n, IgnoreEos: &yes}}
			var toks, size int
			for i := 0; i < 4; i++ {
				k, b := grpcStreamTokens(t, inf, req)
				toks, size = toks+k, size+b
			}
			if toks != 4*int(n) {
				t.Fatalf("%d tokens, want %d", toks, 4*n)
			}
			return float64(size) / float64(toks)
		}
		short, long = measure(64), measure(512)
		s.stop()
		return short, long
	}
	s, l := perToken("")
	t.Logf("real frontend: %.1f message bytes/token at 64 tokens, %.1f at 512", s, l)
	if l > 1.1*s {
		t.Errorf("message bytes per token grow with output length: %.1f at 64 tokens, %.1f at 512", s, l)
	}
	fs, fl := perToken("server.grpc_cumulative_deltas")
	t.Logf("planted cumulative deltas: %.1f message bytes/token at 64 tokens, %.1f at 512", fs, fl)
	if fl < 3*fs {
		t.Errorf("the planted regression was not caught: %.1f bytes/token at 64 tokens, %.1f at 512", fs, fl)
	}
}
