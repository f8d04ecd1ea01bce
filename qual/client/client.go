// Package client is the load generator's HTTP client for OpenAI-compatible completions and
// chat endpoints, streaming or not. It is built for measurement: each SSE event is stamped
// with the monotonic clock when its first byte arrives, events without content are dropped
// before timing exactly as METRICS.md says, and the per-token CPU cost is kept low so the
// client never becomes the bottleneck it is measuring: 1.0-2.1 µs per token at concurrency 32
// on the 2-core development VM before the epoll reader, 1.12-1.29 µs with it in a session where
// the previous path measured 1.33-1.51, and 0.82-0.93 µs with the event template on a quieter
// machine where the path before it measured 0.91-1.07 (qual/load's BenchmarkClientStreamingC32);
// mostly read system calls and the ACKs they send. Requests to http:// servers, streaming or
// not, go through the client's own HTTP/1.1 transport (rawhttp.go: pooled persistent
// connections, the request written from one buffer, reads of only what has arrived, no extra
// empty read per wake-up as net/http does; on Linux one epoll reader per Client reads every ready
// connection after one wake-up, rawio_linux.go, and Begin writes the request on the caller's
// goroutine, so an open loop's pacer puts it on the wire at its scheduled instant); https and
// URLs with user info, a query or a fragment go through net/http; a push-style SSE decoder and a targeted JSON
// field scanner replace encoding/json per event, and an event that repeats the last one but for
// its text string has only that string scanned (sse.go's template).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Endpoint names the two OpenAI routes the client drives.
const (
	Completions = "completions"
	Chat        = "chat"
)

// Connection settings of both transports (net/http's for non-streaming and https requests,
// streamTransport's for streaming http:// requests), kept in one place so that a request
// dials, keeps alive and reuses connections alike whichever path carries it.
const (
	// dialTimeout bounds connecting apart from Options.Timeout, so an unreachable server
	// fails fast even when requests may run for minutes.
	dialTimeout = 10 * time.Second
	// tcpKeepAlive is the TCP keep-alive probe interval, which finds a peer that vanished
	// without closing.
	tcpKeepAlive = 30 * time.Second
	// idleConnTimeout retires pooled connections left idle this long: servers close idle
	// connections on their own schedule, and an old one is likelier to be dead when reused.
	idleConnTimeout = 90 * time.Second
)

// Options configure a Client.
type Options struct {
	// BaseURL is the server root (http://host:port), without /v1.
	BaseURL string
	// Model is sent as "model" in every request body built by the client.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer KEY".
	APIKey string
	// Concurrency sizes the connection pool (idle connections kept per host), so a
	// closed-loop run at concurrency C reuses C connections instead of re-dialing.
	Concurrency int
	// Timeout bounds one request end to end (0: none; the caller's context still applies).
	Timeout time.Duration
}

// Client sends requests and measures them. It is safe for concurrent use.
type Client struct {
	hc *http.Client
	tr *http.Transport
	// st carries streaming requests to http:// servers (nil for other URLs).
	st      *streamTransport
	base    string
	model   string
	auth    string
	timeout time.Duration
}

// New returns a Client whose connection pool is sized to o.Concurrency.
func New(o Options) (*Client, error) {
	if o.BaseURL == "" {
		return nil, errors.New("client.New: Options.BaseURL is empty; pass the server root such as http://127.0.0.1:8000")
	}
	c := max(o.Concurrency, 1)
	tr := &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: tcpKeepAlive,
		}).DialContext,
		MaxIdleConns:        c + 16,
		MaxIdleConnsPerHost: c + 16,
		IdleConnTimeout:     idleConnTimeout,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// Default 4 KiB buffers keep memory per in-flight stream small at high concurrency.
		ReadBufferSize:  4096,
		WriteBufferSize: 4096,
	}
	cl := &Client{
		hc:      &http.Client{Transport: tr},
		tr:      tr,
		base:    strings.TrimRight(o.BaseURL, "/"),
		model:   o.Model,
		timeout: o.Timeout,
	}
	cl.st = newStreamTransport(cl.base, c+16)
	if o.APIKey != "" {
		cl.auth = "Bearer " + o.APIKey
		if !httpguts.ValidHeaderFieldValue(cl.auth) {
			// The key itself is a secret: not quoted.
			return nil, errors.New("client.New: Options.APIKey cannot be sent in the Authorization header: it holds control characters (a newline left from a key file?); strip them")
		}
	}
	return cl, nil
}

// Close releases idle connections.
func (c *Client) Close() {
	c.tr.CloseIdleConnections()
	if c.st != nil {
		c.st.closeIdle()
	}
}

// Prewarm opens n connections ahead of use and from then on keeps at least half as many idle
// (dialled in the background as requests take them), on plain http:// servers; elsewhere it
// does nothing. So a paced schedule's requests rarely need a dial at their send time.
func (c *Client) Prewarm(ctx context.Context, n int) error {
	if c.st == nil {
		return nil
	}
	return c.st.prewarm(ctx, n)
}

// Model returns the model name the client sends.
func (c *Client) Model() string { return c.model }

// Request is one request to send.
type Request struct {
	// ID is sent as X-Request-Id; the server's records are joined to the client's by it.
	ID string
	// Endpoint is Completions or Chat.
	Endpoint string
	// Stream asks for Server-Sent Events (with stream_options.include_usage).
	Stream bool
	// Body, when not nil, is sent as is (it must match Endpoint and Stream); otherwise the
	// body is built from the fields below.
	Body []byte
	// Prompt is the completions prompt.
	Prompt string
	// Messages is the chat messages array as JSON, e.g. [{"role":"user","content":"hi"}].
	Messages json.RawMessage
	// MaxTokens is max_tokens (0: omitted).
	MaxTokens int
	// IgnoreEOS asks the server to generate exactly MaxTokens tokens.
	IgnoreEOS bool
	// Extra fields merged into the built body (temperature, chat_template_kwargs, ...).
	Extra map[string]any
	// CancelAfter > 0 cancels the request that long after its start (StartNs), as a
	// client-side cancellation (Response.Cancelled).
	CancelAfter time.Duration
	// SessionID and Turn place a multi-turn request in its conversation; when SessionID is
	// set they are sent as HeaderSession and HeaderTurn, and qual-server records them.
	SessionID string
	Turn      int
}

// Headers naming a request's conversation and turn. X-Correlation-ID is what AIPerf sends
// with every turn of a conversation (its x_correlation_id, one per session), so a server or
// proxy that already groups AIPerf's sessions groups these too; the turn has no AIPerf
// header and is sent as X-Turn-Index (0-based, as the records' turn_index).
const (
	HeaderSession = "X-Correlation-Id"
	HeaderTurn    = "X-Turn-Index"
)

// Response is what one request measured. Times are ns since the epoch passed to Do, read
// from the monotonic clock.
type Response struct {
	RequestID string
	// StartNs is just before the request's first byte is written (on a reused connection;
	// before the dial when a new connection had to be opened, so that connecting counts in
	// the request's latency as in AIPerf's); StartUnixNs is the same instant on the wall
	// clock, derived from the epoch's wall reading plus the monotonic StartNs.
	StartNs     int64
	StartUnixNs int64
	// AckNs is when the response headers arrived; EndNs when the body ended (on the raw
	// transport: the arrival of its last byte, not when the waiting goroutine woke).
	AckNs int64
	EndNs int64
	// ChunkNs holds the arrival of each content event (non-streaming: one entry, EndNs,
	// when the answer has content).
	ChunkNs []int64
	// Status is the HTTP status (0 when no response arrived).
	Status int
	// Err is set on any failure: transport error, non-2xx status, an error event in the
	// stream, or cancellation. ErrBody keeps a failed response's body (up to 64 KiB).
	Err     *Error
	ErrBody []byte
	// Text is the returned content (reasoning content first where both are present).
	Text []byte
	// FinishReason of the (last) choice; "" when none was sent.
	FinishReason string
	// Usage from the server when HasUsage.
	HasUsage         bool
	PromptTokens     int
	CompletionTokens int
	// ResponseBytes counts response body bytes.
	ResponseBytes int64
	// Cancelled is set when the caller's context ended the request; CancelNs is when.
	Cancelled bool
	CancelNs  int64
}

// Error describes a failed request in AIPerf's terms (code, type, message).
type Error struct {
	Code    int
	Type    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Code, e.Type, e.Message) }

// Reset clears r for reuse, keeping its slices' capacity.
func (r *Response) Reset() {
	chunks, text := r.ChunkNs[:0], r.Text[:0]
	*r = Response{ChunkNs: chunks, Text: text}
}

// errBodyLimit bounds how much of a failed response body is kept.
const errBodyLimit = 64 << 10

// Do sends req and fills resp. epoch is the run's start (a time.Time carrying a monotonic
// reading); every *Ns field is measured from it. Do returns resp.Err as an error when the
// request failed, so callers may check either. A request that cannot be sent as asked (a
// header value with control characters, no chat messages, an unknown endpoint) fails with
// Type "ClientError" before anything is sent, on either transport.
func (c *Client) Do(ctx context.Context, epoch time.Time, req *Request, resp *Response) error {
	var p Pending
	c.Begin(ctx, epoch, req, resp, &p)
	return p.Wait()
}

// Pending is a request that Begin has started and whose answer Wait collects. It is owned by
// the caller (a zero value, or one whose Wait returned) so that starting a request allocates
// nothing of its own.
type Pending struct {
	c       *Client
	ctx     context.Context
	cancels [2]context.CancelFunc
	epoch   time.Time
	req     *Request
	resp    *Response
	path    string
	body    []byte
	// err, when set, is the request's outcome already (it failed before anything was sent).
	err error
	// sent: Begin wrote the request on conn (raw transport on Linux); the answer is read by the
	// transport's epoll reader and Wait only waits for it.
	sent     bool
	prepared bool // Prepare registered conn with the reader; Send writes the request
	early    bool // StartNs was stamped before the connection was taken (Begin)
	conn     *rawConn
	reused   bool
	cancelT  *time.Timer
	beginErr error // a failed write of a sent request
}

// Begin starts req: Prepare, then Send. On the raw transport with the epoll reader (plain
// http:// on Linux) the request is on the wire when Begin returns, and Wait on another goroutine
// only collects the answer; on the other paths (https through net/http, platforms without
// epoll) Begin only checks the request, and Wait sends it. Begin never blocks for long: a request
// larger than the socket's send buffer has its rest written by Wait. StartNs is stamped before a
// dial when no idle connection was left, so a connection opened for the request counts in its
// latency.
func (c *Client) Begin(ctx context.Context, epoch time.Time, req *Request, resp *Response, p *Pending) {
	c.prepare(ctx, epoch, req, resp, p, true)
	p.Send()
}

// Prepare does everything Begin does short of writing the request: it checks the request,
// takes a pooled connection (dialling one when none is idle), lays out the request's bytes and
// registers the connection with the reader. Send then only stamps StartNs and writes, so a
// caller pacing a schedule (qual/load's open loop) prepares the next request while it waits for
// that request's instant and what lies between the instant and the first byte on the wire is
// one write. A dial made by Prepare happened before the request's start and is not part of its
// latency. A prepared request is either sent (Send, then Wait) or released (Discard).
func (c *Client) Prepare(ctx context.Context, epoch time.Time, req *Request, resp *Response, p *Pending) {
	c.prepare(ctx, epoch, req, resp, p, false)
}

// Send writes a request that Prepare readied (on the raw transport; elsewhere Wait sends it).
func (p *Pending) Send() {
	if p.err == nil && p.prepared {
		p.c.st.sendPrepared(p)
	}
}

// Discard releases a prepared request that will not be sent (the run ended before its time):
// its connection goes back to the pool and its contexts are released. No record is made of it.
func (p *Pending) Discard() {
	if p.err == nil && p.prepared {
		p.c.st.discard(p)
	}
	p.release()
}

func (c *Client) prepare(ctx context.Context, epoch time.Time, req *Request, resp *Response, p *Pending, early bool) {
	*p = Pending{c: c, ctx: ctx, epoch: epoch, req: req, resp: resp}
	resp.Reset()
	resp.RequestID = req.ID
	if msg := c.checkHeaders(req); msg != "" {
		resp.Err = &Error{Type: "ClientError", Message: msg}
		p.err = resp.Err
		return
	}
	p.body = req.Body
	if p.body == nil {
		var err error
		p.body, err = c.BuildBody(req)
		if err != nil {
			resp.Err = &Error{Code: 0, Type: "ClientError", Message: err.Error()}
			p.err = resp.Err
			return
		}
	}
	p.path = "/v1/completions"
	if req.Endpoint == Chat {
		p.path = "/v1/chat/completions"
	} else if req.Endpoint != Completions && req.Endpoint != "" {
		resp.Err = &Error{Type: "ClientError", Message: fmt.Sprintf("unknown endpoint %q; use completions or chat", req.Endpoint)}
		p.err = resp.Err
		return
	}
	// The timeout's context is made when the start is stamped (stamp), so that it counts from
	// the request's start whatever time passed between Prepare and Send.
	if req.CancelAfter > 0 {
		p.ctx, p.cancels[1] = context.WithCancel(p.ctx)
	}
	if c.st != nil && c.st.ep != nil {
		c.st.prepare(p, early)
	}
}

// stamp records the request's start (just before its first byte is written) and arms its
// planned cancellation from there. StartUnixNs is the epoch's one wall-clock reading plus a
// monotonic offset, so that differences between requests' StartUnixNs are monotonic
// differences (METRICS.md: never subtract wall-clock readings).
func (p *Pending) stamp() {
	p.resp.StartNs = int64(time.Since(p.epoch))
	p.resp.StartUnixNs = p.epoch.UnixNano() + p.resp.StartNs
	if p.c.timeout > 0 && p.cancels[0] == nil {
		// Below the planned cancellation's context, whose end it inherits.
		p.ctx, p.cancels[0] = context.WithTimeout(p.ctx, p.c.timeout)
	}
	if p.cancels[1] != nil && p.cancelT == nil {
		// Armed after the start is stamped, so the delay is measured from StartNs.
		p.cancelT = time.AfterFunc(p.req.CancelAfter, p.cancels[1])
	}
}

// Wait completes the request that Begin started and returns resp.Err (nil on success).
func (p *Pending) Wait() error {
	defer p.release()
	if p.prepared {
		p.Send() // prepared and never sent: sent now
	}
	if p.err != nil {
		return p.err
	}
	c := p.c
	if c.st != nil {
		err := c.st.wait(p)
		switch {
		case err == nil:
			return nil
		case p.resp.Status/100 != 2 && p.resp.Status != 0 && p.resp.Err != nil && (err == p.resp.Err || p.ctx.Err() == nil):
			// A failed request: status and body recorded.
			return p.resp.Err
		}
		return c.fail(p.ctx, p.epoch, p.resp, err)
	}
	return c.doHTTP(p)
}

// release stops the request's timers and releases its contexts.
func (p *Pending) release() {
	if p.cancelT != nil {
		p.cancelT.Stop()
	}
	for _, f := range p.cancels {
		if f != nil {
			f()
		}
	}
}

// doHTTP sends the request through net/http: the path of https:// and other URLs that the raw
// transport does not serve exactly.
func (c *Client) doHTTP(p *Pending) error {
	p.stamp() // first: it makes the timeout's context
	ctx, epoch, req, resp := p.ctx, p.epoch, p.req, p.resp
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+p.path, bytes.NewReader(p.body))
	if err != nil {
		resp.Err = &Error{Type: "ClientError", Message: err.Error()}
		return resp.Err
	}
	h := hreq.Header
	h["Content-Type"] = []string{"application/json"}
	if req.Stream {
		h["Accept"] = []string{"text/event-stream"}
	} else {
		h["Accept"] = []string{"application/json"}
	}
	if req.ID != "" {
		h["X-Request-Id"] = []string{req.ID}
	}
	if req.SessionID != "" {
		h[HeaderSession] = []string{req.SessionID}
		h[HeaderTurn] = []string{strconv.Itoa(req.Turn)}
	}
	if c.auth != "" {
		h["Authorization"] = []string{c.auth}
	}
	hresp, err := c.hc.Do(hreq)
	if err != nil {
		return c.fail(ctx, epoch, resp, err)
	}
	defer hresp.Body.Close()
	resp.AckNs = int64(time.Since(epoch))
	resp.Status = hresp.StatusCode
	if hresp.StatusCode/100 != 2 {
		b, rerr := io.ReadAll(io.LimitReader(hresp.Body, errBodyLimit))
		resp.ResponseBytes = int64(len(b))
		resp.EndNs = int64(time.Since(epoch))
		resp.ErrBody = b
		resp.Err = statusError(hresp.StatusCode, b)
		if rerr != nil && ctx.Err() != nil {
			return c.fail(ctx, epoch, resp, rerr)
		}
		return resp.Err
	}
	ct := hresp.Header.Get("Content-Type")
	if req.Stream || strings.HasPrefix(ct, "text/event-stream") {
		err = readStream(hresp.Body, epoch, resp)
	} else {
		err = readWhole(hresp.Body, epoch, resp)
	}
	if err != nil {
		return c.fail(ctx, epoch, resp, err)
	}
	return nil
}

// checkHeaders returns why req's header values cannot be sent, or "". It runs before either
// transport because the raw one writes values verbatim (a CR or LF would inject headers),
// and net/http refuses them only as a TransportError, which reads as the server's fault.
// The API key, the other header value a caller chooses, is checked once, in New.
func (c *Client) checkHeaders(req *Request) string {
	if !httpguts.ValidHeaderFieldValue(req.ID) {
		return fmt.Sprintf("request ID %q cannot be sent as X-Request-Id: it holds control characters; use printable characters only", req.ID)
	}
	if !httpguts.ValidHeaderFieldValue(req.SessionID) {
		return fmt.Sprintf("session ID %q cannot be sent as %s: it holds control characters; use printable characters only", req.SessionID, HeaderSession)
	}
	return ""
}

// statusError describes a non-2xx response from its status and body, using the OpenAI
// error object when the body holds one.
func statusError(status int, body []byte) *Error {
	var info chunkInfo
	msg, typ := strings.TrimSpace(string(body)), http.StatusText(status)
	if _, ok := parseChunk(body, nil, &info); ok && info.hasError {
		msg = info.errMessage
		if info.errType != "" {
			typ = info.errType
		}
	}
	return &Error{Code: status, Type: typ, Message: msg}
}

// fail records a transport-level failure, telling cancellation apart.
func (c *Client) fail(ctx context.Context, epoch time.Time, resp *Response, err error) error {
	now := int64(time.Since(epoch))
	if resp.EndNs == 0 {
		resp.EndNs = now
	}
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) {
		resp.Cancelled = true
		resp.CancelNs = now
		resp.Err = &Error{Code: 499, Type: "RequestCancelled", Message: "request cancelled by the client"}
		return resp.Err
	}
	if ctx.Err() != nil {
		resp.Err = &Error{Code: 0, Type: "Timeout", Message: fmt.Sprintf("request timed out: %v", err)}
		return resp.Err
	}
	if resp.Err == nil || resp.Err.Type == "" {
		resp.Err = &Error{Code: resp.Status, Type: "TransportError", Message: err.Error()}
	}
	return resp.Err
}

// BuildBody returns the JSON body for req (model, prompt or messages, stream with usage,
// max_tokens, ignore_eos, extras).
func (c *Client) BuildBody(req *Request) ([]byte, error) {
	b := make([]byte, 0, 256+len(req.Prompt)+len(req.Messages))
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, c.model)
	switch req.Endpoint {
	case Chat:
		if len(req.Messages) == 0 {
			return nil, fmt.Errorf("chat request %s has no messages", req.ID)
		}
		b = append(b, `,"messages":`...)
		b = append(b, req.Messages...)
	default:
		pb, err := json.Marshal(req.Prompt)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"prompt":`...)
		b = append(b, pb...)
	}
	if req.MaxTokens > 0 {
		b = append(b, `,"max_tokens":`...)
		b = strconv.AppendInt(b, int64(req.MaxTokens), 10)
	}
	if req.IgnoreEOS {
		b = append(b, `,"ignore_eos":true`...)
	}
	if req.Stream {
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	for k, v := range req.Extra {
		vb, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("request %s: extra field %q: %w", req.ID, k, err)
		}
		kb, _ := json.Marshal(k)
		b = append(b, ',')
		b = append(b, kb...)
		b = append(b, ':')
		b = append(b, vb...)
	}
	b = append(b, '}')
	return b, nil
}
