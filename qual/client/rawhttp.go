package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
)

// streamTransport sends streaming requests to an http:// server over HTTP/1.1 itself, with
// its own pool of TCP connections, instead of net/http's Transport. What it buys is one read
// system call per wake-up instead of two: net/http (like any io.Reader loop over a
// non-blocking socket) reads again after each event, gets EAGAIN, and only then waits for
// the poller. Here the whole response is parsed inside one syscall.RawConn.Read callback: a
// read shorter than the buffer has emptied the socket, so the callback returns false and
// waits for the next readiness notification; since nothing re-arms the poller between
// reads, a notification for bytes that arrive while an event is being parsed is never lost.
// (An end of stream that arrived with the last data is the exception; see
// closeCheckInterval.) The reader decodes the status line, headers and chunked (or
// Content-Length, or close-delimited) framing in its own buffer and feeds the body straight
// into the event decoder, stamping every read as it returns. FuzzRawResponse holds it to
// net/http's reading of the same bytes. On Linux the same parser is driven instead by one
// epoll reader per transport (epoller, rawio_linux.go), which also spares each event's
// goroutine wake-up; the paragraph above is the path of other platforms.
//
// Non-streaming requests take the same path: their JSON body is gathered in the connection's
// own buffer and scanned once it is complete (wholeBody), so a request costs no goroutine, no
// header map and no allocation beyond its record.
//
// It is used only where it is exact: plain http:// URLs without user info, query or
// fragment. Everything else (https, proxies' URLs with credentials) goes through net/http.
type streamTransport struct {
	addr   string // host:port to dial
	host   string // Host header
	prefix string // path of the base URL, without a trailing slash

	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration

	mu   sync.Mutex
	idle []*rawConn // most recently used last
	// spare, set by prewarm, is how many idle connections are kept open ahead of use: when
	// get leaves fewer than half of it, a goroutine dials the pool back up (refilling), so a
	// paced sender rarely has to dial at a request's send time.
	spare     int
	refilling bool

	// ep reads the responses of all this transport's connections on one thread (Linux;
	// rawio_linux.go); nil where unavailable, and then each request reads its own through
	// Go's poller (syscall.RawConn.Read, below).
	ep *epoller
}

// newStreamTransport returns a transport for base, or nil when base is not a plain http://
// URL that it can serve exactly.
func newStreamTransport(base string, maxIdle int) *streamTransport {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return &streamTransport{
		addr:        net.JoinHostPort(u.Hostname(), port),
		host:        u.Host,
		prefix:      u.EscapedPath(),
		dialer:      net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive},
		maxIdle:     maxIdle,
		idleTimeout: idleConnTimeout,
		ep:          newEpoller(),
	}
}

// closeIdle closes the idle connections.
func (t *streamTransport) closeIdle() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.spare = nil, 0 // and refill stops
	t.mu.Unlock()
	for _, c := range idle {
		c.closeConn()
	}
}

// probeAfter is how long a connection must have been idle before get probes it (one read
// system call) for a close by the server. Servers close idle connections after seconds; a
// close within this window is the race that do's single resend handles anyway (the request
// meets the closed connection before any byte of an answer and is sent again on a new one).
const probeAfter = time.Second

// get returns an idle connection that is still open, or dials a new one. reused says which.
func (t *streamTransport) get(ctx context.Context) (c *rawConn, reused bool, err error) {
	for {
		t.mu.Lock()
		n := len(t.idle)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		c = t.idle[n-1]
		t.idle[n-1] = nil
		t.idle = t.idle[:n-1]
		refill := t.spare > 0 && !t.refilling && len(t.idle) < t.spare/2
		if refill {
			t.refilling = true
		}
		t.mu.Unlock()
		if refill {
			go t.refill()
		}
		idle := time.Since(c.idleSince)
		if idle < probeAfter || (idle < t.idleTimeout && c.alive()) {
			return c, true, nil
		}
		c.closeConn()
	}
	c, err = t.dial(ctx)
	return c, false, err
}

// dial opens a new connection.
func (t *streamTransport) dial(ctx context.Context) (*rawConn, error) {
	nc, err := t.dialer.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, err
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("dial %s: not a TCP connection (%T)", t.addr, nc)
	}
	if t.ep != nil {
		return adoptRawConn(tc)
	}
	c, err := newRawConn(tc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// put returns a connection whose last response ended cleanly to the idle pool.
func (t *streamTransport) put(c *rawConn) {
	c.idleSince = time.Now()
	t.mu.Lock()
	if len(t.idle) < t.maxIdle {
		t.idle = append(t.idle, c)
		c = nil
	}
	t.mu.Unlock()
	if c != nil {
		c.closeConn()
	}
}

// aLongTimeAgo is a deadline in the past: setting it interrupts a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// do sends one streaming request and fills resp (Status, AckNs, the stream, EndNs,
// ResponseBytes; ErrBody and Err for a non-2xx status). path starts with "/". It returns
// a transport error (the caller classifies it), or resp.Err.
//
// A request sent on a reused connection that fails before any byte of a response arrived
// (the write fails, or the read meets the end of the connection or a reset) is sent once
// more, on a new connection. That is how a server closing an idle connection looks when
// its close crosses the request on the wire; get's liveness probe catches only closes that
// arrived before it. A server that took the request and then dropped the connection without
// a byte of answer looks the same and gets the request twice (net/http would not resend a
// POST there), which is why only a reused connection qualifies: a fresh one has no idle
// close to race. Once a response byte has arrived the request is never resent: completions
// are not idempotent, and the server has started answering this one.
func (t *streamTransport) do(ctx context.Context, epoch time.Time, path string, req *Request, auth string, body []byte, resp *Response) error {
	c, reused, err := t.get(ctx)
	if err != nil {
		return err
	}
	answered, err := t.send(ctx, c, epoch, path, req, auth, body, resp)
	if err == nil || !reused || answered || ctx.Err() != nil {
		return err
	}
	// The second and last attempt: a new connection cannot have been closed while idle.
	if c, err = t.dial(ctx); err != nil {
		return err
	}
	_, err = t.send(ctx, c, epoch, path, req, auth, body, resp)
	return err
}

// prewarm dials n connections into the idle pool (up to maxIdle), so that the first requests
// of a paced schedule are written on open connections instead of waiting for a dial.
func (t *streamTransport) prewarm(ctx context.Context, n int) error {
	t.mu.Lock()
	t.spare = min(n, t.maxIdle)
	n = min(n, t.maxIdle-len(t.idle))
	t.mu.Unlock()
	for range n {
		c, err := t.dial(ctx)
		if err != nil {
			return err
		}
		t.put(c)
	}
	return nil
}

// wait completes p: on the epoll path it finishes writing what begin could not and waits for
// the reader to end the response (with do's single resend on a reused connection that closed
// before any byte of an answer); elsewhere it sends the whole request here.
func (t *streamTransport) wait(p *Pending) error {
	if t.ep == nil {
		p.stamp()
		return t.do(p.ctx, p.epoch, p.path, p.req, p.c.auth, p.body, p.resp)
	}
	return t.waitSent(p)
}

// refill dials idle connections until the pool holds spare again (see spare). A failed dial
// ends it: the requests that then find no idle connection dial themselves and report it.
func (t *streamTransport) refill() {
	defer func() {
		t.mu.Lock()
		t.refilling = false
		t.mu.Unlock()
	}()
	for {
		t.mu.Lock()
		short := len(t.idle) < t.spare
		t.mu.Unlock()
		if !short {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		c, err := t.dial(ctx)
		cancel()
		if err != nil {
			return
		}
		t.put(c)
	}
}

// send writes the request on c, reads its response into resp, and then returns c to the
// pool or closes it. answered reports whether any byte of a response arrived.
func (t *streamTransport) send(ctx context.Context, c *rawConn, epoch time.Time, path string, req *Request, auth string, body []byte, resp *Response) (answered bool, err error) {
	c.buildRequest(t, path, req, auth, body)
	if t.ep != nil {
		answered, err = t.ep.exchange(ctx, c, epoch, resp)
		if err == nil && c.reusable {
			t.put(c)
		} else {
			c.closeConn()
		}
		return answered, err
	}
	// Cancellation and timeouts interrupt a blocked read or write through the deadline; a
	// connection whose deadline may have been set is never reused.
	stop := c.watch(ctx)
	_, err = c.nc.Write(c.wbuf)
	if err == nil {
		err = c.readResponse(epoch, resp)
		// Read only after readResponse reset it: after a failed write it is the last response's.
		answered = c.answered
	}
	if stop() && err == nil && c.reusable {
		t.put(c)
	} else {
		c.nc.Close()
	}
	return answered, err
}

// watch makes the end of ctx interrupt the connection's reads and writes (through the
// deadline) until the returned stop is called; stop reports false when it may have done so.
func (c *rawConn) watch(ctx context.Context) (stop func() bool) {
	if ctx.Done() == nil {
		return alwaysTrue // a context that never ends needs no watcher
	}
	return context.AfterFunc(ctx, c.interrupt)
}

func alwaysTrue() bool { return true }

// rawConn is one pooled HTTP/1.1 connection and the state of the response being read on it.
// Its socket is either nc, read through Go's poller, or fd, owned outright and read by the
// transport's epoller (then nc is nil).
type rawConn struct {
	epollConn
	fd        int // the socket when nc is nil (-1 otherwise)
	nc        *net.TCPConn
	rc        syscall.RawConn
	idleSince time.Time
	readFn    func(fd uintptr) bool // c.onReadable, bound once
	probeFn   func(fd uintptr) bool // c.probe, bound once
	silent    bool                  // set by probe
	interrupt func()                // sets a deadline in the past, bound once
	// interrupted is set once the request's context ended (the connection is then closed).
	interrupted atomic.Bool
	wbuf        []byte // the request being sent
	wpos        int    // how much of wbuf is written (epoll path)
	wantStream  bool   // the request asked for a stream

	// Read buffer: buf[rd:wr] is received and not yet consumed.
	buf    []byte
	rd, wr int

	// The response being read.
	epoch    time.Time
	resp     *Response
	dec      eventDecoder
	state    int
	remain   int64 // bytes left in the current chunk or Content-Length body
	teSeen   bool  // Transfer-Encoding: chunked was sent
	http10   bool
	length   int64 // Content-Length, -1 when absent
	close    bool  // Connection: close, HTTP/1.0, or read to EOF
	status   int
	n1xx     int // informational responses skipped
	hdrBytes int
	nBody    int64
	errBody  bool // a non-2xx status: the body is kept in resp.ErrBody
	sse      bool // Content-Type: text/event-stream
	whole    bool // a non-streaming answer: the body is gathered in wholeBuf and scanned at its end
	wholeBuf []byte
	lastT    int64 // arrival of the last bytes read
	answered bool  // a byte of the response arrived: the request must not be resent
	done     bool
	err      error
	reusable bool
}

// Response parser states.
const (
	stStatus     = iota // status line
	stHeader            // header lines
	stChunkSize         // chunk-size line
	stChunkData         // chunk data (remain bytes)
	stChunkEnd          // CRLF after chunk data
	stTrailer           // trailer lines after the last chunk
	stLength            // Content-Length body (remain bytes)
	stUntilClose        // body delimited by the end of the connection
)

// Limits on what the reader accepts.
const (
	maxHeaderBytes = 1 << 20 // response status line and headers
	maxLineBytes   = 4096    // chunk-size and trailer lines
)

func newRawConn(tc *net.TCPConn) (*rawConn, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &rawConn{nc: tc, rc: rc, buf: make([]byte, readBufSize)}
	c.fd = -1
	c.readFn, c.probeFn = c.onReadable, c.probe
	c.interrupt = func() {
		c.interrupted.Store(true) // before the deadline, so readResponse never undoes it
		c.nc.SetDeadline(aLongTimeAgo)
	}
	return c, nil
}

// alive reports whether an idle connection is still open and silent: a non-blocking read
// must find nothing (EAGAIN). An end of stream, an error or unexpected bytes mean it is not.
// (net/http learns the same from the read loop it keeps on every idle connection.)
func (c *rawConn) alive() bool {
	if c.nc == nil {
		return c.aliveFD()
	}
	c.silent = false
	err := c.rc.Read(c.probeFn)
	return err == nil && c.silent
}

// closeConn closes the connection's socket.
func (c *rawConn) closeConn() {
	if c.nc == nil {
		c.closeFD()
		return
	}
	c.nc.Close()
}

func (c *rawConn) probe(fd uintptr) bool {
	var b [1]byte
	for {
		_, err := syscall.Read(int(fd), b[:])
		if err == syscall.EINTR {
			continue
		}
		c.silent = err == syscall.EAGAIN
		return true
	}
}

// buildRequest writes the request line, headers and body into c.wbuf.
func (c *rawConn) buildRequest(t *streamTransport, path string, req *Request, auth string, body []byte) {
	b := c.wbuf[:0]
	b = append(b, "POST "...)
	b = append(b, t.prefix...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, t.host...)
	b = append(b, "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Type: application/json\r\nAccept: "...)
	if req.Stream {
		b = append(b, "text/event-stream"...)
	} else {
		b = append(b, "application/json"...)
	}
	c.wantStream = req.Stream
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	if req.ID != "" {
		b = append(b, "\r\nX-Request-Id: "...)
		b = append(b, req.ID...)
	}
	if req.SessionID != "" {
		b = append(b, "\r\n"+HeaderSession+": "...)
		b = append(b, req.SessionID...)
		b = append(b, "\r\n"+HeaderTurn+": "...)
		b = strconv.AppendInt(b, int64(req.Turn), 10)
	}
	if auth != "" {
		b = append(b, "\r\nAuthorization: "...)
		b = append(b, auth...)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.wbuf = b
}

// closeCheckInterval bounds how long a stream may wait without reading. A read that empties
// the socket proves no data is left, but not that no end of stream (FIN or reset) arrived
// together with that data: its readiness notification may have been the same one. Servers
// end streams with the last chunk, not by closing, so a close there is a failure; it is
// noticed by a read at most this long after it (only the failure's EndNs can be that late;
// every event is stamped as it arrives).
const closeCheckInterval = 200 * time.Millisecond

// readResponse reads one response into resp.
func (c *rawConn) readResponse(epoch time.Time, resp *Response) error {
	c.begin(epoch, resp)
	for {
		c.nc.SetReadDeadline(time.Now().Add(closeCheckInterval))
		if c.interrupted.Load() {
			// Cancelled between the check below and the new deadline: restore the past one.
			c.nc.SetDeadline(aLongTimeAgo)
		}
		err := c.rc.Read(c.readFn)
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !c.interrupted.Load() {
			continue // the periodic check: Read reads once before it waits again
		}
		if err == nil && !c.interrupted.Load() {
			c.nc.SetReadDeadline(time.Time{})
		}
		return c.end(err)
	}
}

// begin resets the parser for a response into resp.
func (c *rawConn) begin(epoch time.Time, resp *Response) {
	c.epoch, c.resp = epoch, resp
	c.dec.reset(resp)
	c.state, c.remain, c.length, c.close = stStatus, 0, -1, false
	c.status, c.n1xx, c.hdrBytes, c.nBody, c.lastT = 0, 0, 0, 0, 0
	c.errBody, c.answered, c.done, c.err, c.reusable = false, false, false, nil, false
	c.sse, c.whole, c.wholeBuf = false, false, c.wholeBuf[:0]
}

// end completes resp after the read loop returned err, and decides whether the connection
// can carry another request.
func (c *rawConn) end(err error) error {
	resp := c.resp
	c.resp = nil
	if err == nil {
		err = c.err
	}
	if resp.Status == 0 {
		// No response (the caller records the failure).
		return err
	}
	resp.ResponseBytes = c.nBody
	resp.EndNs = int64(time.Since(c.epoch))
	if c.done && c.lastT > 0 {
		// The arrival of the response's last bytes: the goroutine that gets here may have
		// waited for a processor after the reader ended the response.
		resp.EndNs = c.lastT
	}
	if c.errBody {
		// A failed request: its status and body make the error (a read error after the
		// headers only shortens the kept body, as on the net/http path).
		resp.Err = statusError(resp.Status, resp.ErrBody)
		if err != nil {
			return err
		}
		return resp.Err
	}
	if err != nil {
		return fmt.Errorf("read event stream: %w", err)
	}
	if c.wr > c.rd {
		// Bytes after the end of the response: the connection is out of step.
		c.close = true
	}
	c.reusable = !c.close
	if c.reusable && len(c.buf) > readBufSize {
		// A long header or line grew the buffer; an idle connection keeps only the usual size.
		c.buf = make([]byte, readBufSize)
		c.rd, c.wr = 0, 0
	}
	if cap(c.wholeBuf) > wholeKeep {
		c.wholeBuf = nil
	}
	if resp.Err != nil {
		return resp.Err
	}
	return nil
}

// onReadable is the RawConn.Read callback: it reads until the socket is drained, parsing as
// it goes, and returns true when the response is complete or failed, false to wait for more.
func (c *rawConn) onReadable(fd uintptr) bool {
	for {
		p := c.space()
		n, err := syscall.Read(int(fd), p)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return false
		}
		if err != nil {
			c.err = &net.OpError{Op: "read", Net: "tcp", Err: err}
			return true
		}
		if n <= 0 {
			c.endOfStream()
			return true
		}
		c.received(n, int64(time.Since(c.epoch)))
		if c.done || c.err != nil {
			return true
		}
		if n < len(p) && c.state != stUntilClose {
			// A short read empties the socket's receive queue: wait for the poller. (A body
			// that ends with the connection reads on until the end: see closeCheckInterval.)
			return false
		}
	}
}

// space returns the free end of the read buffer, moving unconsumed bytes to the front or
// growing the buffer when an unfinished line fills it.
func (c *rawConn) space() []byte {
	if c.rd == c.wr {
		c.rd, c.wr = 0, 0
	} else if c.wr == len(c.buf) {
		if c.rd > 0 {
			c.wr = copy(c.buf, c.buf[c.rd:c.wr])
			c.rd = 0
		} else {
			nb := make([]byte, 2*len(c.buf))
			copy(nb, c.buf[:c.wr])
			c.buf = nb
		}
	}
	return c.buf[c.wr:]
}

// received takes n bytes read into space() that arrived at t.
func (c *rawConn) received(n int, t int64) {
	c.wr += n
	c.answered = true
	c.lastT = t
	c.parse(t)
}

// endOfStream handles the server closing the connection.
func (c *rawConn) endOfStream() {
	c.close = true
	switch {
	case c.state == stUntilClose:
		c.finish()
	case c.state == stStatus && c.wr == c.rd && c.hdrBytes == 0 && c.n1xx > 0:
		c.err = fmt.Errorf("server closed the connection after %d informational (1xx) response(s), before the final response", c.n1xx)
	case c.state == stStatus && c.wr == c.rd && c.hdrBytes == 0:
		c.err = errors.New("server closed the connection before responding")
	default:
		c.err = io.ErrUnexpectedEOF
	}
}

// finish ends the body.
func (c *rawConn) finish() {
	switch {
	case c.whole:
		// The error, if any, is the response's (resp.Err), as on the net/http path.
		_ = wholeBody(c.wholeBuf, c.lastT, c.resp)
	case !c.errBody:
		c.dec.end()
	}
	c.done = true
}

// wholeKeep bounds the non-streaming body buffer an idle connection keeps.
const wholeKeep = 64 << 10

// body takes decoded body bytes that arrived at t.
func (c *rawConn) body(p []byte, t int64) {
	c.nBody += int64(len(p))
	if c.whole {
		c.wholeBuf = append(c.wholeBuf, p...)
		return
	}
	if !c.errBody {
		c.dec.write(p, t)
		return
	}
	r := c.resp
	if keep := errBodyLimit - len(r.ErrBody); keep > 0 {
		r.ErrBody = append(r.ErrBody, p[:min(len(p), keep)]...)
	}
	if len(r.ErrBody) >= errBodyLimit {
		// Enough of a failed response is kept; the rest is not read.
		c.close = true
		c.done = true
	}
}

// nextLine returns the next complete line of buf[rd:wr] without its CRLF (or LF) and
// consumes it; ok is false when no line has ended yet.
func (c *rawConn) nextLine() (line []byte, ok bool) {
	i := bytes.IndexByte(c.buf[c.rd:c.wr], '\n')
	if i < 0 {
		return nil, false
	}
	line = c.buf[c.rd : c.rd+i]
	c.rd += i + 1
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, true
}

// parse consumes what it can of buf[rd:wr], which ended arriving at t.
func (c *rawConn) parse(t int64) {
	for !c.done && c.err == nil {
		switch c.state {
		case stChunkEnd:
			// Chunk data ends with exactly CRLF.
			if c.wr-c.rd < 2 {
				return
			}
			if c.buf[c.rd] != '\r' || c.buf[c.rd+1] != '\n' {
				c.err = errors.New("malformed chunked encoding: chunk data not followed by CRLF")
				return
			}
			c.rd += 2
			c.state = stChunkSize
		case stStatus, stHeader, stChunkSize, stTrailer:
			start := c.rd
			line, ok := c.nextLine()
			if c.state <= stHeader {
				c.hdrBytes += c.rd - start
				if c.hdrBytes+(c.wr-c.rd) > maxHeaderBytes {
					c.err = fmt.Errorf("response headers exceed %d bytes", maxHeaderBytes)
					return
				}
			} else if !ok && c.wr-c.rd > maxLineBytes {
				c.err = errors.New("malformed chunked encoding: line too long")
				return
			}
			if !ok {
				return
			}
			c.lineIn(line, t)
		case stChunkData, stLength:
			if c.rd == c.wr {
				return
			}
			k := int(min(c.remain, int64(c.wr-c.rd)))
			p := c.buf[c.rd : c.rd+k]
			c.rd += k
			c.remain -= int64(k)
			c.body(p, t)
			if c.remain == 0 {
				if c.state == stLength {
					c.finish()
				} else {
					c.state = stChunkEnd
				}
			}
		case stUntilClose:
			if c.rd == c.wr {
				return
			}
			p := c.buf[c.rd:c.wr]
			c.rd = c.wr
			c.body(p, t)
		}
	}
}

// lineIn handles one line of the status, header, chunk-size or trailer states (parse handles
// the CRLF that ends chunk data itself).
func (c *rawConn) lineIn(line []byte, t int64) {
	switch c.state {
	case stStatus:
		c.statusLine(line)
	case stHeader:
		if len(line) == 0 {
			c.headersDone(t)
			return
		}
		c.headerLine(line)
	case stChunkSize:
		if i := bytes.IndexByte(line, ';'); i >= 0 {
			line = line[:i] // chunk extensions are ignored
		}
		line = bytes.TrimRight(line, " \t")
		n, err := strconv.ParseUint(string(line), 16, 62)
		if err != nil || len(line) == 0 {
			c.err = fmt.Errorf("malformed chunked encoding: chunk size %q", line)
			return
		}
		if n == 0 {
			c.state = stTrailer
			return
		}
		c.state, c.remain = stChunkData, int64(n)
	case stTrailer:
		if len(line) == 0 {
			c.finish()
			return
		}
		c.splitHeader(line) // trailers are checked, not kept
	}
}

func (c *rawConn) statusLine(line []byte) {
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		c.err = fmt.Errorf("malformed HTTP status line %q", line[:min(len(line), 64)])
		return
	}
	code := 0
	for _, d := range line[9:12] {
		if d < '0' || d > '9' {
			c.err = fmt.Errorf("malformed HTTP status code in %q", line[:min(len(line), 64)])
			return
		}
		code = code*10 + int(d-'0')
	}
	if code < 100 {
		c.err = fmt.Errorf("malformed HTTP status code in %q", line[:min(len(line), 64)])
		return
	}
	c.status = code
	c.http10 = line[7] == '0'
	c.close = c.http10 // HTTP/1.0 closes unless told otherwise; we never ask it to
	c.teSeen, c.length = false, -1
	c.state = stHeader
}

// splitHeader checks a header (or trailer) line and splits it into name and value. Names
// must be tokens and values free of control bytes, by the same httpguts checks net/http
// makes, so that FuzzRawResponse's "what we accept, net/http accepts" holds; continuation
// lines (obsolete line folding) are refused.
func (c *rawConn) splitHeader(line []byte) (name, value []byte, ok bool) {
	i := bytes.IndexByte(line, ':')
	if i <= 0 {
		c.err = fmt.Errorf("malformed HTTP response header %q", line[:min(len(line), 64)])
		return nil, nil, false
	}
	if !httpguts.ValidHeaderFieldName(string(line[:i])) {
		c.err = fmt.Errorf("malformed HTTP response header name %q", line[:i])
		return nil, nil, false
	}
	value = bytes.Trim(line[i+1:], " \t")
	if !httpguts.ValidHeaderFieldValue(string(value)) {
		c.err = fmt.Errorf("malformed HTTP response header value of %q", line[:i])
		return nil, nil, false
	}
	return line[:i], value, true
}

func (c *rawConn) headerLine(line []byte) {
	name, value, ok := c.splitHeader(line)
	if !ok {
		return
	}
	switch {
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		if c.teSeen || !bytes.EqualFold(value, []byte("chunked")) {
			c.err = fmt.Errorf("unsupported Transfer-Encoding %q", value)
			return
		}
		c.teSeen = true
	case bytes.EqualFold(name, []byte("Content-Length")):
		n, err := strconv.ParseUint(string(value), 10, 63)
		if err != nil || (c.length >= 0 && int64(n) != c.length) {
			c.err = fmt.Errorf("malformed Content-Length %q", value)
			return
		}
		c.length = int64(n)
	case bytes.EqualFold(name, []byte("Content-Type")):
		c.sse = bytes.HasPrefix(bytes.ToLower(value), []byte("text/event-stream"))
	case bytes.EqualFold(name, []byte("Connection")):
		for _, tok := range bytes.Split(value, []byte(",")) {
			if bytes.EqualFold(bytes.TrimSpace(tok), []byte("close")) {
				c.close = true
			}
		}
	}
}

// headersDone moves on to the body once the blank line after the headers arrived at t.
func (c *rawConn) headersDone(t int64) {
	r := c.resp
	if c.status/100 == 1 {
		if c.status == 101 {
			c.err = errors.New("server switched protocols (101); streaming requests never ask for that")
			return
		}
		// An informational response: the real one follows (net/http allows five).
		if c.n1xx++; c.n1xx > 5 {
			c.err = errors.New("too many 1xx informational responses")
			return
		}
		c.state, c.hdrBytes = stStatus, 0
		return
	}
	r.Status, r.AckNs = c.status, t
	// Transfer-Encoding means nothing in HTTP/1.0 (as net/http reads it).
	chunked := c.teSeen && !c.http10
	c.errBody = r.Status/100 != 2
	// A non-streaming answer is one JSON object unless the server streamed anyway (as the
	// net/http path reads it: by Content-Type).
	c.whole = !c.errBody && !c.wantStream && !c.sse
	switch {
	case r.Status == 204 || r.Status == 304:
		c.finish()
	case chunked:
		c.state = stChunkSize
	case c.length == 0:
		c.finish()
	case c.length > 0:
		c.state, c.remain = stLength, c.length
	default:
		c.state, c.close = stUntilClose, true
	}
}
