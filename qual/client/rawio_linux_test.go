//go:build linux

package client

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The raw transport's tests pass through Go's poller as well: it is the path of every other
// platform, and Linux runs it only here.
func TestRawStreamPortablePath(t *testing.T) {
	useEpoll = false
	t.Cleanup(func() { useEpoll = true })
	for name, test := range map[string]func(*testing.T){
		"Framings":              TestRawStreamFramings,
		"ConnectionReuse":       TestRawStreamConnectionReuse,
		"ServerClosedIdle":      TestRawStreamServerClosedIdleConnection,
		"RetriesDropped":        TestRawStreamRetriesReusedConnectionDroppedBeforeResponse,
		"NoRetryFresh":          TestRawStreamNoRetryOnFreshConnection,
		"CloseErrorNames":       TestRawStreamCloseErrorNamesWhatArrived,
		"NoRetryAfterStarted":   TestRawStreamNoRetryAfterResponseStarted,
		"FailedStatusKeepsBody": TestRawStreamFailedStatusKeepsBody,
		"Malformed":             TestRawStreamMalformedResponses,
		"Timeout":               TestRawStreamTimeout,
		"BasePath":              TestRawStreamBasePath,
		"ConcurrentStreams":     TestRawStreamConcurrentStreams,
		"CancelMidStream":       TestRawStreamCancelMidStream,
		"CloseMidEvent":         TestRawStreamServerClosesMidEvent,
		"LargeRequestBody":      TestRawStreamLargeRequestBody,
	} {
		t.Run(name, test)
	}
	if newEpoller() != nil {
		t.Fatal("useEpoll = false still gives transports an epoller")
	}
}

// numberedEvents returns n completion events whose texts are "<i>," for i in [0, n), the last
// with a finish reason and usage, and the text they make.
func numberedEvents(n int) (events []string, text string) {
	var sb strings.Builder
	for i := range n {
		tok := fmt.Sprintf("%d,", i)
		sb.WriteString(tok)
		ev := fmt.Sprintf(`data: {"choices":[{"index":0,"text":%q,"finish_reason":null}]}`+"\n\n", tok)
		if i == n-1 {
			ev = fmt.Sprintf(`data: {"choices":[{"index":0,"text":%q,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":%d}}`+"\n\ndata: [DONE]\n\n", tok, n)
		}
		events = append(events, ev)
	}
	return events, sb.String()
}

// Many streams at once, each event in its own chunk and write (interleaved across
// connections as a batching server sends them), each read into its own response.
func TestRawStreamConcurrentStreams(t *testing.T) {
	const streams, tokens = 48, 40
	events, want := numberedEvents(tokens)
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i, ev := range events {
			fmt.Fprintf(conn, "%x\r\n%s\r\n", len(ev), ev)
			if i%8 == 0 {
				time.Sleep(50 * time.Microsecond) // let other connections' events in between
			}
		}
		io.WriteString(conn, "0\r\n\r\n")
		return true
	})
	c, err := New(Options{BaseURL: base, Model: "m", Concurrency: streams})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, streams*2)
	for s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 2 { // the second request reuses the connection
				var resp Response
				id := fmt.Sprintf("s%d-%d", s, r)
				err := c.Do(context.Background(), time.Now(), &Request{ID: id, Endpoint: Completions, Stream: true, Prompt: "p"}, &resp)
				switch {
				case err != nil:
					errs <- fmt.Errorf("%s: %v", id, err)
				case string(resp.Text) != want || len(resp.ChunkNs) != tokens || resp.CompletionTokens != tokens || resp.FinishReason != "length":
					errs <- fmt.Errorf("%s: text %q chunks %d tokens %d finish %q", id, resp.Text, len(resp.ChunkNs), resp.CompletionTokens, resp.FinishReason)
				default:
					for i, ns := range resp.ChunkNs {
						if ns < resp.AckNs || ns > resp.EndNs || (i > 0 && ns < resp.ChunkNs[i-1]) {
							errs <- fmt.Errorf("%s: chunk %d at %d outside [ack %d, end %d] or before the one before", id, i, ns, resp.AckNs, resp.EndNs)
							break
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Cancelling a request in the middle of its stream ends it at once as RequestCancelled with
// what arrived so far, leaves the other streams of the same client running, and the client
// keeps working.
func TestRawStreamCancelMidStream(t *testing.T) {
	events, want := numberedEvents(3)
	firstSent := make(chan struct{}, 1)
	release := make(chan struct{})
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		if r.Header.Get("X-Request-Id") == "stall" {
			fmt.Fprintf(conn, "%x\r\n%s\r\n", len(events[0]), events[0])
			firstSent <- struct{}{}
			<-release
			return false
		}
		for _, ev := range events {
			fmt.Fprintf(conn, "%x\r\n%s\r\n", len(ev), ev)
		}
		io.WriteString(conn, "0\r\n\r\n")
		return true
	})
	t.Cleanup(func() { close(release) })
	c := newClient(t, base)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var resp Response
	var err error
	go func() {
		defer close(done)
		err = c.Do(ctx, time.Now(), &Request{ID: "stall", Endpoint: Completions, Stream: true, Prompt: "p"}, &resp)
	}()
	<-firstSent
	// The stalled stream does not hold up another one on the same client.
	other, oerr := doStreamReq(t, c, "other")
	if oerr != nil || string(other.Text) != want {
		t.Fatalf("a stream beside the stalled one: err %v text %q", oerr, other.Text)
	}
	// Wait for the first event to be read, so that the cancel falls mid-stream.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c.st.ep == nil || time.Now().After(deadline) {
			break
		}
		if partial := func() bool {
			for _, cn := range c.st.ep.registered() {
				cn.mu.Lock()
				got := cn.resp != nil && len(cn.resp.ChunkNs) == 1
				cn.mu.Unlock()
				if got {
					return true
				}
			}
			return false
		}(); partial {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if err == nil || resp.Err == nil || resp.Err.Type != "RequestCancelled" || !resp.Cancelled {
		t.Fatalf("cancelled stream: err %v resp.Err %+v", err, resp.Err)
	}
	// (The portable path is not watched, so there the cancel may even come before the headers.)
	if (c.st.ep != nil && (resp.Status != 200 || len(resp.ChunkNs) != 1)) || string(resp.Text) != strings.Repeat("0,", len(resp.ChunkNs)) {
		t.Errorf("cancelled stream kept status %d chunks %d text %q, want 200 and the first event", resp.Status, len(resp.ChunkNs), resp.Text)
	}
	again, aerr := doStreamReq(t, c, "after")
	if aerr != nil || string(again.Text) != want {
		t.Fatalf("after a cancel: err %v text %q", aerr, again.Text)
	}
}

// registered returns the connections registered now (for tests).
func (e *epoller) registered() []*rawConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	var cs []*rawConn
	for _, c := range e.slots {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// A server that closes the connection inside an event: a chunked or sized body is cut short
// (a TransportError that keeps the events before the cut); a body delimited by the close ends
// there, the partial event included, exactly as when the close came on its own. The close is
// sent with the last bytes, in one write, and in a later one.
func TestRawStreamServerClosesMidEvent(t *testing.T) {
	events, _ := numberedEvents(3)
	whole := events[0] + events[1]
	cut := whole + events[2][:20]
	cases := []struct {
		name, head, body string
		wantErr          bool
	}{
		{"chunked", "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s", len(whole), whole, len(events[2]), events[2][:20]), true},
		{"content-length", fmt.Sprintf("Content-Length: %d\r\n", len(whole)+len(events[2])), cut, true},
		{"until-close", "", cut, false},
	}
	for _, tc := range cases {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/split=%v", tc.name, split), func(t *testing.T) {
				base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
					raw := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + tc.head + "\r\n" + tc.body
					if split {
						writeInPieces(conn, raw, len(raw)-7)
					} else {
						io.WriteString(conn, raw)
					}
					return false
				})
				resp, err := doStreamReq(t, newClient(t, base), "r")
				if tc.wantErr {
					if err == nil || resp.Err == nil || resp.Err.Type != "TransportError" || !strings.Contains(resp.Err.Message, io.ErrUnexpectedEOF.Error()) {
						t.Fatalf("err %v resp.Err %+v, want a TransportError for the cut", err, resp.Err)
					}
				} else if err != nil {
					t.Fatalf("err %v", err)
				}
				if string(resp.Text) != "0,1," || len(resp.ChunkNs) != 2 || resp.Status != 200 {
					t.Errorf("text %q chunks %d status %d, want the two whole events", resp.Text, len(resp.ChunkNs), resp.Status)
				}
			})
		}
	}
}

// A request body larger than the socket's send buffer goes out whole while the server reads
// it; one the server never reads ends with the client's timeout, not a hang.
func TestRawStreamLargeRequestBody(t *testing.T) {
	// Larger than the send buffer and the unread receive buffer can hold together (at most
	// 4 MiB and 128 KiB by the default tcp_wmem and tcp_rmem).
	prompt := strings.Repeat("x", 16<<20)
	var got atomic.Int64
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		got.Store(r.ContentLength)
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 64))
		return true
	})
	var resp Response
	err := newClient(t, base).Do(context.Background(), time.Now(), &Request{ID: "big", Endpoint: Completions, Stream: true, Prompt: prompt}, &resp)
	checkThreeEvents(t, &resp, err)
	if n := got.Load(); n < int64(len(prompt)) {
		t.Errorf("server read a body of %d bytes, want more than the %d-byte prompt", n, len(prompt))
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		if conn, err := ln.Accept(); err == nil {
			accepted <- conn // never read
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case conn := <-accepted:
			conn.Close()
		default:
		}
	})
	c, err := New(Options{BaseURL: "http://" + ln.Addr().String(), Model: "m", Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp = Response{}
	err = c.Do(context.Background(), time.Now(), &Request{ID: "stuck", Endpoint: Completions, Stream: true, Prompt: prompt}, &resp)
	if err == nil || resp.Err == nil || resp.Err.Type != "Timeout" || resp.Status != 0 {
		t.Fatalf("err %v resp.Err %+v status %d, want a Timeout before any response", err, resp.Err, resp.Status)
	}
}

// A Client left idle holds no reader: the reader ends once no connection is registered.
func TestRawStreamReaderEndsWhenIdle(t *testing.T) {
	base, _ := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 64))
		return true
	})
	c := newClient(t, base)
	resp, err := doStreamReq(t, c, "r")
	checkThreeEvents(t, resp, err)
	running := func() bool {
		c.st.ep.mu.Lock()
		defer c.st.ep.mu.Unlock()
		return c.st.ep.running
	}
	for deadline := time.Now().Add(idleExit + 10*time.Second); running(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reader still runs with no stream registered")
		}
	}
	// A new request starts a new reader.
	resp, err = doStreamReq(t, c, "r2")
	checkThreeEvents(t, resp, err)
}
