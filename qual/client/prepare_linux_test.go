//go:build linux

package client

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// prepareServer answers every request with threeEvents on a kept connection after delay,
// counting requests.
func prepareServer(t *testing.T, delay time.Duration) (string, *atomic.Int32, *atomic.Int32) {
	t.Helper()
	var reqs atomic.Int32
	base, conns := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		reqs.Add(1)
		time.Sleep(delay)
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 40))
		return true
	})
	return base, conns, &reqs
}

// prepareAfterOne completes one request on c (leaving an idle connection in its pool) and
// prepares the request id, which takes that connection.
func prepareAfterOne(t *testing.T, c *Client, id string) (*Response, *Pending) {
	t.Helper()
	resp, err := doStreamReq(t, c, "first")
	checkThreeEvents(t, resp, err)
	var r Response
	var p Pending
	c.Prepare(context.Background(), time.Now(), &Request{ID: id, Endpoint: Completions, Stream: true, Prompt: "p"}, &r, &p)
	return &r, &p
}

// A prepared request is stamped and written by Send, not by Prepare: its StartNs is the
// Send's instant, the server sees nothing before it, and Wait collects the answer.
func TestPrepareSendStampsAtSend(t *testing.T) {
	base, _, reqs := prepareServer(t, 0)
	c := newClient(t, base)
	epoch := time.Now()
	var resp Response
	var p Pending
	c.Prepare(context.Background(), epoch, &Request{ID: "p", Endpoint: Completions, Stream: true, Prompt: "p"}, &resp, &p)
	time.Sleep(30 * time.Millisecond)
	if n := reqs.Load(); n != 0 {
		t.Fatalf("the server saw %d requests after Prepare alone, want 0", n)
	}
	before := time.Since(epoch)
	p.Send()
	err := p.Wait()
	checkThreeEvents(t, &resp, err)
	if resp.StartNs < int64(before) {
		t.Errorf("StartNs %v is before Send (%v): it was stamped by Prepare", time.Duration(resp.StartNs), before)
	}
	if reqs.Load() != 1 {
		t.Errorf("the server saw %d requests, want 1", reqs.Load())
	}
}

// The client's timeout counts from the request's start (Send), not from Prepare: a request
// prepared long before its instant is not cut short by the wait.
func TestPrepareTimeoutCountsFromSend(t *testing.T) {
	base, _, _ := prepareServer(t, 40*time.Millisecond)
	c, err := New(Options{BaseURL: base, Model: "m", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var resp Response
	var p Pending
	c.Prepare(context.Background(), time.Now(), &Request{ID: "t", Endpoint: Completions, Stream: true, Prompt: "p"}, &resp, &p)
	time.Sleep(1200 * time.Millisecond) // longer than the timeout
	p.Send()
	checkThreeEvents(t, &resp, p.Wait())
}

// Discard releases a prepared request: nothing reaches the server, and its connection goes
// back to the pool (the next request reuses it rather than dialling).
func TestPrepareDiscardReturnsConnection(t *testing.T) {
	base, conns, reqs := prepareServer(t, 0)
	c := newClient(t, base)
	_, p := prepareAfterOne(t, c, "dropped")
	p.Discard()
	resp, err := doStreamReq(t, c, "third")
	checkThreeEvents(t, resp, err)
	if n := reqs.Load(); n != 2 {
		t.Errorf("the server saw %d requests, want 2 (the discarded one never sent)", n)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections dialled, want 1 (the discarded request's connection reused)", n)
	}
}

// A server that closes the prepared (idle, reused) connection while the request waits for its
// instant: Send's write fails or the reader sees the close, and Wait retries on a new
// connection as for any reused connection that was dropped before it was answered.
func TestPrepareServerClosesWhilePrepared(t *testing.T) {
	var mu sync.Mutex
	var open []net.Conn
	base, conns := rawServer(t, func(conn net.Conn, r *http.Request) bool {
		mu.Lock()
		open = append(open, conn)
		mu.Unlock()
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked(threeEvents, 40))
		return true
	})
	c := newClient(t, base)
	r2, p := prepareAfterOne(t, c, "second")
	mu.Lock()
	for _, cn := range open {
		cn.Close() // the server's idle close, after the connection was taken
	}
	mu.Unlock()
	time.Sleep(20 * time.Millisecond) // the FIN arrives before the write
	p.Send()
	checkThreeEvents(t, r2, p.Wait())
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections dialled, want 2 (the closed one replaced)", n)
	}
}
