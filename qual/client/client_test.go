package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sseServer answers every request with the given SSE lines, flushing after each write
// (each element of writes is one write).
func sseServer(t *testing.T, writes ...string) (*httptest.Server, *atomic.Value) {
	t.Helper()
	var lastID atomic.Value
	lastID.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastID.Store(r.Header.Get("X-Request-Id"))
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range writes {
			io.WriteString(w, s)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &lastID
}

func newClient(t *testing.T, base string) *Client {
	t.Helper()
	c, err := New(Options{BaseURL: base, Model: "m", Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestStreamFiltersNonContentEvents(t *testing.T) {
	srv, lastID := sseServer(t,
		`data: {"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`+"\n\n",
		"data:\n\n", // empty data
		": keep-alive comment\n\n",
		`data: {"choices":[{"index":0,"delta":{"reasoning_content":"think "}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}`+"\r\n\r\n", // CRLF framing
		"data: {not json}\n\n",
		`data: {"choices":[{"index":0,"delta":{"content":"lo"}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n",
		`data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`+"\n\n",
		"data: [DONE]\n\n",
	)
	c := newClient(t, srv.URL)
	var resp Response
	err := c.Do(context.Background(), time.Now(), &Request{ID: "req-1", Endpoint: Chat, Stream: true, Messages: []byte(`[{"role":"user","content":"hi"}]`)}, &resp)
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if got := lastID.Load().(string); got != "req-1" {
		t.Errorf("X-Request-Id sent = %q, want req-1", got)
	}
	if string(resp.Text) != "think Hello" {
		t.Errorf("text = %q, want %q", resp.Text, "think Hello")
	}
	// Content events: reasoning, "Hel", "lo" — the role chunk, the empty, invalid, final
	// and usage events and [DONE] carry no content.
	if len(resp.ChunkNs) != 3 {
		t.Fatalf("content events = %d (%v), want 3", len(resp.ChunkNs), resp.ChunkNs)
	}
	for i := 1; i < len(resp.ChunkNs); i++ {
		if resp.ChunkNs[i] < resp.ChunkNs[i-1] {
			t.Errorf("chunk times not monotonic: %v", resp.ChunkNs)
		}
	}
	if resp.ChunkNs[0] < resp.StartNs || resp.AckNs < resp.StartNs || resp.EndNs < resp.ChunkNs[2] {
		t.Errorf("times out of order: start %d ack %d chunks %v end %d", resp.StartNs, resp.AckNs, resp.ChunkNs, resp.EndNs)
	}
	if resp.FinishReason != "length" || !resp.HasUsage || resp.PromptTokens != 5 || resp.CompletionTokens != 3 {
		t.Errorf("finish %q usage %v %d/%d, want length, 5/3", resp.FinishReason, resp.HasUsage, resp.PromptTokens, resp.CompletionTokens)
	}
	if resp.Status != 200 || resp.ResponseBytes == 0 {
		t.Errorf("status %d bytes %d", resp.Status, resp.ResponseBytes)
	}
}

// An event is stamped when its first byte arrives, not when the scanner reaches it: the
// second event is released only after the test notes the time, so its stamp must be later.
func TestStreamStampsOnArrival(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"text":"a"}]}`+"\n\n"+`data: {"choices":[{"text":"b"}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, `data: {"choices":[{"text":"c"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	epoch := time.Now()
	var released int64
	go func() {
		time.Sleep(20 * time.Millisecond) // let the first write arrive; not asserted on
		released = int64(time.Since(epoch))
		close(release)
	}()
	var resp Response
	if err := c.Do(context.Background(), epoch, &Request{ID: "r", Endpoint: Completions, Stream: true, Prompt: "x"}, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.ChunkNs) != 3 || string(resp.Text) != "abc" {
		t.Fatalf("chunks %v text %q", resp.ChunkNs, resp.Text)
	}
	if resp.ChunkNs[0] != resp.ChunkNs[1] {
		t.Errorf("two events of one read got different stamps %d, %d", resp.ChunkNs[0], resp.ChunkNs[1])
	}
	if resp.ChunkNs[2] < released {
		t.Errorf("third event stamped at %d, before it was released at %d", resp.ChunkNs[2], released)
	}
}

func TestStreamLongAndMultilineEvents(t *testing.T) {
	long := strings.Repeat("x", 20000) // longer than the read buffer
	srv, _ := sseServer(t,
		`data: {"choices":[{"text":"`+long+`"}]}`+"\n\n",
		"data: {\"choices\":\ndata: [{\"text\":\"y\"}]}\n\n", // one event over two data lines
		"data: [DONE]\n\n")
	c := newClient(t, srv.URL)
	var resp Response
	if err := c.Do(context.Background(), time.Now(), &Request{ID: "r", Endpoint: Completions, Stream: true, Prompt: "x"}, &resp); err != nil {
		t.Fatal(err)
	}
	if string(resp.Text) != long+"y" || len(resp.ChunkNs) != 2 {
		t.Fatalf("text len %d chunks %d", len(resp.Text), len(resp.ChunkNs))
	}
}

func TestNonStreaming(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			t.Errorf("path %s", r.URL.Path)
		}
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"max_tokens":7`) || !strings.Contains(string(body), `"ignore_eos":true`) || strings.Contains(string(body), `"stream"`) {
			t.Errorf("body %s", body)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"index":0,"text":"seven","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":7}}`)
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	var resp Response
	if err := c.Do(context.Background(), time.Now(), &Request{ID: "r", Endpoint: Completions, Prompt: "p", MaxTokens: 7, IgnoreEOS: true}, &resp); err != nil {
		t.Fatal(err)
	}
	if string(resp.Text) != "seven" || len(resp.ChunkNs) != 1 || resp.ChunkNs[0] != resp.EndNs || resp.CompletionTokens != 7 || resp.FinishReason != "length" {
		t.Fatalf("resp %+v", resp)
	}
}

func TestFailedRequestKeepsStatusAndBody(t *testing.T) {
	body := `{"error":{"message":"max_tokens 5000 exceeds the context of 256","type":"invalid_request_error","param":"max_tokens","code":400}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		io.WriteString(w, body)
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	var resp Response
	err := c.Do(context.Background(), time.Now(), &Request{ID: "r", Endpoint: Completions, Prompt: "p"}, &resp)
	var e *Error
	if !errors.As(err, &e) || e.Code != 400 || e.Type != "invalid_request_error" || !strings.Contains(e.Message, "exceeds the context") {
		t.Fatalf("err = %v", err)
	}
	if resp.Status != 400 || string(resp.ErrBody) != body {
		t.Fatalf("status %d body %q", resp.Status, resp.ErrBody)
	}
}

func TestStreamErrorEvent(t *testing.T) {
	srv, _ := sseServer(t, `data: {"choices":[{"text":"a"}]}`+"\n\n",
		`data: {"error":{"message":"worker 1 exited","type":"server_error","code":503}}`+"\n\n")
	c := newClient(t, srv.URL)
	var resp Response
	err := c.Do(context.Background(), time.Now(), &Request{ID: "r", Endpoint: Completions, Stream: true, Prompt: "p"}, &resp)
	if err == nil || resp.Err.Code != 503 || resp.Err.Type != "server_error" {
		t.Fatalf("err %v resp.Err %+v", err, resp.Err)
	}
}

func TestCancellation(t *testing.T) {
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"choices":[{"text":"a"}]}`+"\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := newClient(t, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	var resp Response
	err := c.Do(ctx, time.Now(), &Request{ID: "r", Endpoint: Completions, Stream: true, Prompt: "p"}, &resp)
	if err == nil || !resp.Cancelled || resp.Err.Code != 499 || resp.CancelNs < resp.StartNs {
		t.Fatalf("err %v cancelled %v resp.Err %+v", err, resp.Cancelled, resp.Err)
	}
}

func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := newClient(t, url)
	var resp Response
	err := c.Do(context.Background(), time.Now(), &Request{ID: "r", Endpoint: Completions, Prompt: "p"}, &resp)
	if err == nil || resp.Err.Type != "TransportError" || resp.Status != 0 {
		t.Fatalf("err %v %+v", err, resp.Err)
	}
}

// A request ID or API key that cannot be a header value is the caller's mistake, not the
// server's: the key is refused by New, a request ID on both transports as a ClientError naming
// the field, before any connection is made.
func TestBadHeaderValuesRefusedBeforeSending(t *testing.T) {
	var conns, reqs atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reqs.Add(1) }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	const badKey = "sk-secret\r\nX-Injected: 1"
	cases := []struct{ name, id, field string }{
		{"request ID", "r\r\nX-Injected: 1", "X-Request-Id"},
		{"request ID NUL", "r\x00", "X-Request-Id"},
	}
	if c, err := New(Options{BaseURL: srv.URL, Model: "m", APIKey: badKey}); err == nil || c != nil ||
		!strings.Contains(err.Error(), "APIKey") || strings.Contains(err.Error(), "sk-secret") {
		t.Errorf("New with a key holding CR LF: client %v, err %v; want no client and an error naming APIKey, not the key", c, err)
	}
	for _, tc := range cases {
		for _, stream := range []bool{true, false} {
			path := "net/http"
			if stream {
				path = "raw"
			}
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				c, err := New(Options{BaseURL: srv.URL, Model: "m", APIKey: "sk-secret"})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if stream && c.st == nil {
					t.Fatal("a streaming request to an http:// URL must take the raw transport")
				}
				var resp Response
				err = c.Do(context.Background(), time.Now(), &Request{ID: tc.id, Endpoint: Completions, Stream: stream, Prompt: "p"}, &resp)
				var e *Error
				if !errors.As(err, &e) || e.Type != "ClientError" || !strings.Contains(e.Message, tc.field) {
					t.Fatalf("err %v, want a ClientError naming %s", err, tc.field)
				}
				if strings.Contains(e.Message, "sk-secret") {
					t.Errorf("the error shows the API key: %q", e.Message)
				}
				if resp.Err != e || resp.StartNs != 0 {
					t.Errorf("resp.Err %+v StartNs %d, want the same error and no start", resp.Err, resp.StartNs)
				}
			})
		}
	}
	if n, r := conns.Load(), reqs.Load(); n != 0 || r != 0 {
		t.Errorf("server saw %d connections and %d requests, want none", n, r)
	}
}

func TestBuildBodyChat(t *testing.T) {
	c := newClient(t, "http://x")
	b, err := c.BuildBody(&Request{Endpoint: Chat, Stream: true, Messages: []byte(`[{"role":"user","content":"q"}]`), MaxTokens: 3,
		Extra: map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"chat_template_kwargs":{"enable_thinking":false}}`
	if string(b) != want {
		t.Fatalf("body\n%s\nwant\n%s", b, want)
	}
	if _, err := c.BuildBody(&Request{ID: "r9", Endpoint: Chat}); err == nil || !strings.Contains(err.Error(), "r9") {
		t.Fatalf("empty messages: %v", err)
	}
}

// BenchmarkReadStream measures the client's own parsing cost per SSE event (no network):
// a completions stream of 256 one-token events in the server's chunk format.
func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	for i := 0; i < 256; i++ {
		sb.WriteString(`data: {"id":"cmpl-5f1c2b7a9e","object":"text_completion","created":1764400000,"model":"mock","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(`data: {"id":"cmpl-5f1c2b7a9e","object":"text_completion","created":1764400000,"model":"mock","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":256,"total_tokens":257}}` + "\n\ndata: [DONE]\n\n")
	body := sb.String()
	epoch := time.Now()
	var resp Response
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		resp.Reset()
		if err := readStream(strings.NewReader(body), epoch, &resp); err != nil || len(resp.ChunkNs) != 256 {
			b.Fatal(err, len(resp.ChunkNs))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/event")
}

// TestNonStreamingRawPath: a non-streaming request to an http:// server goes over the raw
// transport (one pooled connection for every request), whatever the body's framing
// (Content-Length, chunked in pieces that split the JSON, or text/event-stream answered to a
// non-streaming request), with the Accept and session headers sent, and the same record as
// the net/http path: one content chunk stamped at the body's end, which is EndNs.
func TestNonStreamingRawPath(t *testing.T) {
	const answer = `{"choices":[{"index":0,"text":"seven","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":7}}`
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a := r.Header.Get("Accept"); a != "application/json" {
			t.Errorf("Accept %q", a)
		}
		if s, k := r.Header.Get(HeaderSession), r.Header.Get(HeaderTurn); s != "conv-1" || k != "2" {
			t.Errorf("session headers %q %q, want conv-1 2", s, k)
		}
		switch r.Header.Get("X-Request-Id") { // the framing to answer with
		case "chunked":
			w.Header().Set("Content-Type", "application/json")
			for _, piece := range []string{answer[:10], answer[10:41], answer[41:]} {
				io.WriteString(w, piece)
				w.(http.Flusher).Flush()
				time.Sleep(2 * time.Millisecond)
			}
		case "sse":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: "+answer+"\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, answer)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := newClient(t, srv.URL)
	if c.st == nil || c.st.ep == nil {
		t.Skip("no raw transport with the epoll reader here")
	}
	for i, framing := range []string{"length", "chunked", "sse", "length"} {
		var resp Response
		if err := c.Do(context.Background(), time.Now(), &Request{ID: framing, Endpoint: Completions, Prompt: "p", MaxTokens: 7,
			SessionID: "conv-1", Turn: 2}, &resp); err != nil {
			t.Fatalf("request %d (%s): %v", i, framing, err)
		}
		if string(resp.Text) != "seven" || len(resp.ChunkNs) != 1 || resp.CompletionTokens != 7 || resp.FinishReason != "length" ||
			resp.EndNs < resp.ChunkNs[0] || resp.StartNs <= 0 || resp.AckNs < resp.StartNs {
			t.Fatalf("request %d (%s): resp %+v", i, framing, resp)
		}
		if framing != "sse" && (resp.ChunkNs[0] != resp.EndNs || resp.ResponseBytes != int64(len(answer))) {
			t.Fatalf("request %d (%s): chunk at %d, end %d, %d bytes", i, framing, resp.ChunkNs[0], resp.EndNs, resp.ResponseBytes)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 4 sequential requests, want 1 (reused)", n)
	}
}
