package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawServer accepts connections and, for every request read on one, calls respond with the
// connection and the request; respond writes the raw response bytes. It returns the base URL
// and a count of accepted connections.
func rawServer(t *testing.T, respond func(conn net.Conn, r *http.Request) (keepOpen bool)) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, r.Body)
					if !respond(conn, r) {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), &conns
}

// writeInPieces writes s in pieces of n bytes, pausing so that each piece is likely read on
// its own (the assertions hold however the reads split it).
func writeInPieces(w io.Writer, s string, n int) {
	for len(s) > 0 {
		k := min(n, len(s))
		w.Write([]byte(s[:k]))
		s = s[k:]
		time.Sleep(100 * time.Microsecond)
	}
}

// chunked frames body as HTTP/1.1 chunks of at most n bytes, with a chunk extension on the
// first chunk and a trailer, as a server may.
func chunked(body string, n int) string {
	var b strings.Builder
	first := true
	for len(body) > 0 {
		k := min(n, len(body))
		if first {
			fmt.Fprintf(&b, "%x;ext=1\r\n%s\r\n", k, body[:k])
			first = false
		} else {
			fmt.Fprintf(&b, "%X\r\n%s\r\n", k, body[:k])
		}
		body = body[k:]
	}
	b.WriteString("0\r\nX-Trailer: t\r\n\r\n")
	return b.String()
}

const threeEvents = `data: {"choices":[{"text":"a"}]}` + "\n\n" + `data: {"choices":[{"text":"bc"}]}` + "\r\n\r\n" +
	`data: {"choices":[{"text":"d","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3}}` + "\n\ndata: [DONE]\n\n"

func doStreamReq(t *testing.T, c *Client, id string) (*Response, error) {
	t.Helper()
	var resp Response
	err := c.Do(context.Background(), time.Now(), &Request{ID: id, Endpoint: Completions, Stream: true, Prompt: "p"}, &resp)
	return &resp, err
}

func checkThreeEvents(t *testing.T, resp *Response, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if string(resp.Text) != "abcd" || len(resp.ChunkNs) != 3 || resp.FinishReason != "length" || resp.CompletionTokens != 3 || resp.Status != 200 {
		t.Fatalf("text %q chunks %d finish %q tokens %d status %d", resp.Text, len(resp.ChunkNs), resp.FinishReason, resp.CompletionTokens, resp.Status)
	}
	if resp.ResponseBytes != int64(len(threeEvents)) {
		t.Errorf("ResponseBytes %d, want the body's %d", resp.ResponseBytes, len(threeEvents))
	}
}

// Every framing a server may use, split at awkward places (inside chunk-size lines, between
// a chunk and its CRLF, inside SSE lines), decodes to the same events.
func TestRawStreamFramings(t *testing.T) {
	cases := []struct {
		name, head, body string
	}{
		{"chunked", "Transfer-Encoding: chunked\r\n", chunked(threeEvents, 7)},
		{"chunked-one", "Transfer-Encoding: chunked\r\n", chunked(threeEvents, 1<<20)},
		{"content-length", fmt.Sprintf("Content-Length: %d\r\n", len(threeEvents)), threeEvents},
		{"until-close", "Connection: close\r\n", threeEvents},
	}
	for _, tc := range cases {
		for _, piece := range []int{1, 5, 4096} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, piece), func(t *testing.T) {
				base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
					writeInPieces(conn, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+tc.head+"\r\n"+tc.body, piece)
					return tc.name != "until-close"
				})
				resp, err := doStreamReq(t, newClient(t, base), "r")
				checkThreeEvents(t, resp, err)
			})
		}
	}
}

// Streaming requests reuse one connection, each sending its X-Request-Id; a response that
// says Connection: close makes the next request dial anew.
func TestRawStreamConnectionReuse(t *testing.T) {
	var ids []string
	var mu sync.Mutex
	closeNext := atomic.Bool{}
	base, conns := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		mu.Lock()
		ids = append(ids, r.Header.Get("X-Request-Id"))
		mu.Unlock()
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
		cl := closeNext.Load()
		if cl {
			head += "Connection: close\r\n"
		}
		io.WriteString(conn, head+"\r\n"+chunked(threeEvents, 40))
		return !cl
	})
	c := newClient(t, base)
	for i := range 4 {
		closeNext.Store(i == 1)
		resp, err := doStreamReq(t, c, fmt.Sprintf("id-%d", i))
		checkThreeEvents(t, resp, err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("connections = %d, want 2 (one reused twice, a new one after Connection: close)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(ids, ",") != "id-0,id-1,id-2,id-3" {
		t.Errorf("X-Request-Id received %v", ids)
	}
}

// A server that closes idle connections: the next request must notice before sending and
// use a new connection, not fail.
func TestRawStreamServerClosedIdleConnection(t *testing.T) {
	base, conns := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 64))
		return false // close after the response, without saying so
	})
	c := newClient(t, base)
	for i := range 3 {
		resp, err := doStreamReq(t, c, fmt.Sprint(i))
		checkThreeEvents(t, resp, err)
		// Let the FIN arrive before the next request takes the idle connection, so that the
		// probe in get is what is tested (without it the retry in do may save the request).
		time.Sleep(20 * time.Millisecond)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("connections = %d, want 3", n)
	}
}

// droppingServer answers every request with threeEvents and keeps the connection open,
// except that when drop(n) is true for the n-th request on a connection (from 1), it sends
// only partial and closes the connection: with partial empty, what a client sees when a
// server's close of an idle keep-alive connection crosses its next request. It returns the
// base URL, the number of connections accepted (the client's dials) and the X-Request-Id of
// every request received, in order.
func droppingServer(t *testing.T, drop func(n int) bool, partial string) (string, *atomic.Int32, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var ids []string
	perConn := map[net.Conn]int{}
	base, conns := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		mu.Lock()
		ids = append(ids, r.Header.Get("X-Request-Id"))
		perConn[conn]++
		n := perConn[conn]
		mu.Unlock()
		if drop(n) {
			io.WriteString(conn, partial)
			return false
		}
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 40))
		return true
	})
	return base, conns, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ids)
	}
}

// A kept-alive connection that the server drops as the next request arrives on it (after
// get's liveness probe passed, so only the retry can save the request): the request is sent
// once more, on one new connection, and succeeds.
func TestRawStreamRetriesReusedConnectionDroppedBeforeResponse(t *testing.T) {
	base, dials, ids := droppingServer(t, func(n int) bool { return n == 2 }, "")
	c := newClient(t, base)
	resp, err := doStreamReq(t, c, "a")
	checkThreeEvents(t, resp, err)
	resp, err = doStreamReq(t, c, "b") // reuses a's connection, which the server drops
	checkThreeEvents(t, resp, err)
	if n := dials.Load(); n != 2 {
		t.Errorf("dials = %d, want 2 (the first, and one for the retry)", n)
	}
	if got := strings.Join(ids(), ","); got != "a,b,b" {
		t.Errorf("server received %q, want a,b,b (b once on the dead connection, once on the new one)", got)
	}
}

// A new connection has no idle close to race, so a request that fails on one is not resent,
// even when no response byte arrived.
func TestRawStreamNoRetryOnFreshConnection(t *testing.T) {
	base, dials, ids := droppingServer(t, func(int) bool { return true }, "")
	resp, err := doStreamReq(t, newClient(t, base), "a")
	checkNotResent(t, resp, err, dials, ids, "a")
}

// The error says what arrived: nothing at all, or only informational responses (a 100
// Continue and then the close is not "closed before responding").
func TestRawStreamCloseErrorNamesWhatArrived(t *testing.T) {
	for partial, want := range map[string]string{
		"":                              "before responding",
		"HTTP/1.1 100 Continue\r\n\r\n": "after 1 informational (1xx) response(s), before the final response",
	} {
		base, _, _ := droppingServer(t, func(int) bool { return true }, partial)
		resp, err := doStreamReq(t, newClient(t, base), "a")
		if err == nil || resp.Err == nil || !strings.Contains(resp.Err.Message, want) {
			t.Errorf("after %q: err %v, resp.Err %+v; want a message containing %q", partial, err, resp.Err, want)
		}
	}
}

// Once any byte of a response arrived, the server has started answering: a completion is not
// idempotent, so a failure after that is returned, never resent, even on a reused connection.
func TestRawStreamNoRetryAfterResponseStarted(t *testing.T) {
	ev := `data: {"choices":[{"text":"a"}]}` + "\n\n"
	cases := map[string]string{
		"status line":   "HTTP/1.1 200 OK\r\n",
		"informational": "HTTP/1.1 100 Continue\r\n\r\n",
		"one event":     fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev),
	}
	for name, partial := range cases {
		t.Run(name, func(t *testing.T) {
			base, dials, ids := droppingServer(t, func(n int) bool { return n == 2 }, partial)
			c := newClient(t, base)
			resp, err := doStreamReq(t, c, "a")
			checkThreeEvents(t, resp, err)
			resp, err = doStreamReq(t, c, "b")
			checkNotResent(t, resp, err, dials, ids, "a,b")
		})
	}
}

// checkNotResent asserts that the last request failed as a TransportError and was not resent:
// the server received the request IDs want (comma-separated), all over the one connection
// dialled.
func checkNotResent(t *testing.T, resp *Response, err error, dials *atomic.Int32, ids func() []string, want string) {
	t.Helper()
	if err == nil || resp.Err == nil || resp.Err.Type != "TransportError" {
		t.Fatalf("err %v resp.Err %+v, want a TransportError", err, resp.Err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("dials = %d, want 1 (no retry)", n)
	}
	if got := strings.Join(ids(), ","); got != want {
		t.Errorf("server received %q, want %q (the last request once)", got, want)
	}
}

func TestRawStreamFailedStatusKeepsBody(t *testing.T) {
	body := `{"error":{"message":"queue full","type":"overloaded","code":429}}`
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		writeInPieces(conn, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(body, 10), 9)
		return true
	})
	c := newClient(t, base)
	for range 2 { // a failed request's connection is closed; the second request dials anew and reads the same error
		resp, err := doStreamReq(t, c, "r")
		var e *Error
		if !errors.As(err, &e) || e.Code != 429 || e.Type != "overloaded" || e.Message != "queue full" {
			t.Fatalf("err = %v", err)
		}
		if resp.Status != 429 || string(resp.ErrBody) != body || len(resp.ChunkNs) != 0 {
			t.Fatalf("status %d body %q chunks %d", resp.Status, resp.ErrBody, len(resp.ChunkNs))
		}
	}
}

func TestRawStreamMalformedResponses(t *testing.T) {
	cases := map[string]string{
		"truncated chunk":   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n",
		"bad chunk size":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"chunk without end": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
		"bad status line":   "HTTP/1.1 2x0 OK\r\n\r\n",
		"not http":          "SSH-2.0-OpenSSH\r\n\r\n",
		"short body":        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: x\n\n",
		"nothing":           "",
		// Otherwise complete, empty responses: only the header checks refuse them.
		"header name not a token":   "HTTP/1.1 200 OK\r\nX Bad: 1\r\nContent-Length: 0\r\n\r\n",
		"control byte in a value":   "HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n",
		"control byte in a trailer": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: a\x7fb\r\n\r\n",
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
				io.WriteString(conn, raw)
				return false
			})
			resp, err := doStreamReq(t, newClient(t, base), "r")
			if err == nil || resp.Err == nil || resp.Err.Type != "TransportError" {
				t.Fatalf("err %v resp.Err %+v, want a TransportError", err, resp.Err)
			}
			if resp.EndNs < resp.StartNs {
				t.Errorf("EndNs %d before StartNs %d", resp.EndNs, resp.StartNs)
			}
		})
	}
}

func TestRawStreamTimeout(t *testing.T) {
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		ev := `data: {"choices":[{"text":"a"}]}` + "\n\n"
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev) // and no last chunk
		io.Copy(io.Discard, conn)                                                                           // stall until the client gives up
		return false
	})
	c, err := New(Options{BaseURL: base, Model: "m", Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := doStreamReq(t, c, "r")
	if err == nil || resp.Err.Type != "Timeout" || resp.Status != 200 || len(resp.ChunkNs) != 1 {
		t.Fatalf("err %v status %d chunks %d", err, resp.Status, len(resp.ChunkNs))
	}
}

// The base URL's path is kept in front of /v1 (a server behind a path prefix).
func TestRawStreamBasePath(t *testing.T) {
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, threeEvents)
	}))
	defer srv.Close()
	resp, err := doStreamReq(t, newClient(t, srv.URL+"/prefix/"), "r")
	checkThreeEvents(t, resp, err)
	if path != "/prefix/v1/completions" {
		t.Errorf("path %q", path)
	}
}

// parseRaw runs the raw response parser over data, fed in pieces of the given sizes (cycled),
// as if each piece were one read.
func parseRaw(data []byte, pieces []int) (*Response, error) {
	resp := &Response{}
	c := &rawConn{buf: make([]byte, 64)} // small, so that growth and compaction are exercised
	c.begin(time.Now(), resp)
	k := 0
	for len(data) > 0 && !c.done && c.err == nil {
		p := c.space()
		n := min(len(p), len(data))
		if len(pieces) > 0 {
			n = min(n, max(1, pieces[k%len(pieces)]))
			k++
		}
		copy(p, data[:n])
		data = data[n:]
		c.received(n, int64(k))
	}
	if !c.done && c.err == nil {
		c.endOfStream()
	}
	return resp, c.end(nil)
}

// FuzzRawResponse checks the raw HTTP/1.1 response parser against net/http: whatever it
// accepts, net/http must accept too, with the same status and the same body (compared
// through the event decoder for a 2xx stream, as kept for a failed status), however the
// bytes are split into reads.
func FuzzRawResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 9)), []byte{3, 1, 7})
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 34\r\n\r\n"+`data: {"choices":[{"text":"a"}]}`+"\n\n"), []byte{})
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nContent-Length: 5\r\n\r\nbusy!"), []byte{2})
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\ndata: x\n\n"), []byte{1})
	f.Add([]byte("HTTP/1.1 204 No Content\r\n\r\n"), []byte{})
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n"), []byte{5})
	f.Fuzz(func(t *testing.T, data, pieces []byte) {
		sizes := make([]int, len(pieces))
		for i, p := range pieces {
			sizes[i] = int(p)
		}
		got, err := parseRaw(data, sizes)
		if err != nil && (got.Status/100 == 2 || got.Status == 0) {
			return // refused or cut short; nothing to compare
		}
		// Ours accepted the response (or kept a failed status's body): so must net/http.
		br := bufio.NewReader(bytes.NewReader(data))
		var hr *http.Response
		for {
			hr, err = http.ReadResponse(br, &http.Request{Method: http.MethodPost})
			if err != nil {
				t.Fatalf("raw parser accepted %q (status %d), net/http refuses it: %v", data, got.Status, err)
			}
			if hr.StatusCode/100 != 1 {
				break
			}
		}
		if hr.StatusCode != got.Status {
			t.Fatalf("%q: status %d, net/http says %d", data, got.Status, hr.StatusCode)
		}
		body, rerr := io.ReadAll(hr.Body)
		if got.Status/100 != 2 {
			want := body[:min(len(body), errBodyLimit)]
			if rerr == nil && !bytes.Equal(got.ErrBody, want) {
				t.Fatalf("%q: error body %q, net/http reads %q", data, got.ErrBody, want)
			}
			return
		}
		if rerr != nil {
			t.Fatalf("raw parser read the whole body of %q, net/http fails: %v", data, rerr)
		}
		var want Response
		readStream(bytes.NewReader(body), time.Now(), &want)
		if string(got.Text) != string(want.Text) || len(got.ChunkNs) != len(want.ChunkNs) || got.FinishReason != want.FinishReason ||
			got.CompletionTokens != want.CompletionTokens || (got.Err == nil) != (want.Err == nil) || got.ResponseBytes != int64(len(body)) {
			t.Fatalf("%q: got text %q chunks %d bytes %d, net/http body gives text %q chunks %d bytes %d",
				data, got.Text, len(got.ChunkNs), got.ResponseBytes, want.Text, len(want.ChunkNs), len(body))
		}
	})
}
