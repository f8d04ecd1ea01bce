//go:build linux

package client

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// useEpoll makes new transports read through an epoller; tests turn it off to run the same
// cases through the portable path (Go's poller).
var useEpoll = true

// idleExit is how long the epoller's reader waits with no connection registered before it
// ends, so that a Client no longer in use holds no thread; a busy Client keeps its reader.
const idleExit = time.Second

// epoller reads the responses of one transport's streaming connections on a single goroutine,
// locked to its thread, that waits in epoll_wait for all of them and reads every ready
// connection in one loop. Through Go's poller each connection's goroutine is woken on its own
// for every burst of events (the runtime's netpoll, a ready, a schedule, often a futex to wake
// another thread): 14-20% of the client's CPU in profiles at concurrency 32 against the mock.
// Here one wake-up serves every connection that became ready, and a request's goroutine wakes
// once, when its response has ended.
//
// The epoller owns its sockets outright: adoptRawConn takes the descriptor from net and closes
// net's, so Go's poller no longer watches the socket (if both did, each arrival would also wake
// the runtime's poller thread for nothing). Registrations are edge-triggered, so a connection is
// read until a short read and an arrival after that read raises a new event; the peer's close is
// part of the event (EPOLLRDHUP), so, unlike the portable path, no periodic read is needed to
// notice a close that came with the last data. Every read is stamped as it returns, as before.
//
// The reader starts with the first registration and ends after idleExit with none.
type epoller struct {
	mu      sync.Mutex
	epfd    int // valid while running
	running bool
	active  int        // registered connections: while any is, the reader keeps epfd open
	seq     uint32     // registration counter: an event carries its registration's tag
	slots   []*rawConn // registered connections by slot (an event's Fd field)
	free    []int32    // free slots
}

// epollConn is a rawConn's state shared between its request's goroutine and the reader.
type epollConn struct {
	// mu is held by the reader while it reads the socket and by the request's goroutine while
	// it registers, stops or unregisters the connection: a socket is never read after its
	// registration ended, so it can be closed or reused.
	mu        sync.Mutex
	tag       uint32 // the registration's tag (0: not registered)
	slot      int32
	epfd      int
	reading   bool          // the reader reads the response
	writeWait bool          // the request's writer waits for room in the send buffer
	finished  chan struct{} // the reader ended the response (one token per registration that ends so)
	writable  chan struct{} // the reader saw room after writeWait
}

func newEpoller() *epoller {
	if !useEpoll {
		return nil
	}
	return &epoller{}
}

// adoptRawConn takes tc's socket for the epoller: a duplicate of its descriptor (same socket,
// already non-blocking) is kept and tc is closed, which removes it from Go's poller.
func adoptRawConn(tc *net.TCPConn) (*rawConn, error) {
	fd := -1
	rc, err := tc.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
		if err == nil {
			err = cerr
		}
	}
	tc.Close()
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("take over the socket of %s: %w", tc.RemoteAddr(), err)
	}
	c := &rawConn{fd: fd, buf: make([]byte, readBufSize)}
	c.finished = make(chan struct{}, 1)
	c.writable = make(chan struct{}, 1)
	return c, nil
}

// aliveFD is alive for an adopted socket (see there).
func (c *rawConn) aliveFD() bool {
	var b [1]byte
	for {
		_, err := syscall.Read(c.fd, b[:])
		if err == unix.EINTR {
			continue
		}
		return err == unix.EAGAIN
	}
}

// closeFD closes an adopted socket; it must not be registered.
func (c *rawConn) closeFD() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// exchange writes the request built in c.wbuf and reads its response into resp, with the
// semantics of the portable path (streamTransport.send): answered reports whether a byte of the
// response arrived; the end of ctx stops the request, and the connection must then be closed.
func (e *epoller) exchange(ctx context.Context, c *rawConn, epoch time.Time, resp *Response) (answered bool, err error) {
	c.begin(epoch, resp)
	c.wpos = 0
	if err := e.register(c); err != nil {
		c.resp = nil
		return false, err
	}
	if err := c.writeFD(ctx); err != nil {
		// The request did not go out whole: its error is the answer, as on the portable path,
		// even if a response (to a request the server could not read) arrived meanwhile.
		c.stopReading()
		e.unregister(c)
		c.resp = nil
		return false, err
	}
	select {
	case <-c.finished:
	case <-ctx.Done():
		if !c.stopReading() {
			err = ctx.Err()
		}
	}
	e.unregister(c)
	return c.answered, c.end(err)
}

// stopReading takes the response back from the reader; finished reports that the reader
// ended it first (its token is then consumed).
func (c *rawConn) stopReading() (finished bool) {
	c.mu.Lock()
	if c.reading {
		c.reading = false
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	<-c.finished
	return true
}

// writeNow writes what it can of c.wbuf[c.wpos:] without waiting (begin's write on the
// pacer's goroutine); writeFD waits for room for the rest.
func (c *rawConn) writeNow() error {
	for c.wpos < len(c.wbuf) {
		n, err := syscall.Write(c.fd, c.wbuf[c.wpos:])
		switch {
		case err == nil:
			c.wpos += n
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			return nil
		default:
			return &net.OpError{Op: "write", Net: "tcp", Err: err}
		}
	}
	return nil
}

// writeFD writes the rest of c.wbuf (from c.wpos) to the socket; when the send buffer is full
// it waits for the reader to report room (EPOLLOUT), or for the end of ctx.
func (c *rawConn) writeFD(ctx context.Context) error {
	asked := false
	defer func() {
		if asked {
			c.mu.Lock()
			c.writeWait = false
			c.mu.Unlock()
		}
	}()
	for c.wpos < len(c.wbuf) {
		n, err := syscall.Write(c.fd, c.wbuf[c.wpos:])
		switch {
		case err == nil:
			c.wpos += n
			continue
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			return &net.OpError{Op: "write", Net: "tcp", Err: err}
		}
		if !asked {
			// Ask for the signal, then try again: room made before the ask sends none.
			c.mu.Lock()
			c.writeWait = true
			c.mu.Unlock()
			asked = true
			continue
		}
		select {
		case <-c.writable:
			asked = false // the reader cleared writeWait with its signal
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// register adds c to the epoll set (starting the reader if none runs) for one response.
func (e *epoller) register(c *rawConn) error {
	e.mu.Lock()
	if !e.running {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			e.mu.Unlock()
			return fmt.Errorf("epoll_create1: %w", err)
		}
		e.epfd, e.running = fd, true
		go e.loop(fd)
	}
	var slot int32
	if n := len(e.free); n > 0 {
		slot, e.free = e.free[n-1], e.free[:n-1]
	} else {
		slot = int32(len(e.slots))
		e.slots = append(e.slots, nil)
	}
	e.slots[slot] = c
	if e.seq++; e.seq == 0 {
		e.seq = 1 // 0 means not registered
	}
	tag := e.seq
	e.active++
	epfd := e.epfd
	e.mu.Unlock()

	c.mu.Lock()
	c.tag, c.slot, c.epfd, c.reading, c.writeWait = tag, slot, epfd, true, false
	c.mu.Unlock()
	// ADD reports readiness that already exists, so nothing before it is missed.
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: slot, Pad: int32(tag)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		c.stopReading()
		e.unregister(c)
		return fmt.Errorf("epoll_ctl add: %w", err)
	}
	return nil
}

// unregister ends c's registration; the reader no longer touches c afterwards.
func (e *epoller) unregister(c *rawConn) {
	c.mu.Lock()
	slot, epfd := c.slot, c.epfd
	c.tag, c.reading, c.writeWait = 0, false, false
	c.mu.Unlock()
	unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, c.fd, nil) // ENOENT after a failed ADD
	e.mu.Lock()
	e.slots[slot] = nil
	e.free = append(e.free, slot)
	e.active--
	e.mu.Unlock()
}

// loop is the reader: it waits for events and handles every ready connection in turn.
func (e *epoller) loop(epfd int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	events := make([]unix.EpollEvent, 128)
	conns := make([]*rawConn, len(events))
	for {
		n, err := unix.EpollWait(epfd, events, int(idleExit/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// epfd is valid until this loop closes it: only a bug gets here.
			panic(fmt.Sprintf("client: epoll_wait on the stream reader's own descriptor failed: %v", err))
		}
		if n == 0 {
			e.mu.Lock()
			if e.active == 0 {
				e.running = false
				unix.Close(epfd)
				e.mu.Unlock()
				return
			}
			e.mu.Unlock()
			continue
		}
		// The slots are looked up once per wake-up; each connection's tag is then checked
		// under its own lock, which is what keeps a stale event from touching a reused slot.
		e.mu.Lock()
		for i := range n {
			if s := int(events[i].Fd); s < len(e.slots) {
				conns[i] = e.slots[s]
			}
		}
		e.mu.Unlock()
		for i := range n {
			if c := conns[i]; c != nil {
				conns[i] = nil
				c.onEvent(events[i].Events, uint32(events[i].Pad))
			}
		}
	}
}

// onEvent handles an event of registration tag on c.
func (c *rawConn) onEvent(events, tag uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tag != c.tag {
		return
	}
	if events&unix.EPOLLOUT != 0 && c.writeWait {
		c.writeWait = false
		select {
		case c.writable <- struct{}{}:
		default:
		}
	}
	const closed = unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	if c.reading && events&(unix.EPOLLIN|closed) != 0 && c.readFD(events&closed != 0) {
		c.reading = false
		c.finished <- struct{}{}
	}
}

// readFD reads until the socket is drained (or, when the peer closed, until its end), parsing
// as it goes; it reports whether the response is complete or failed. (Sockets are read and
// written through package syscall rather than unix because its calls tell the race detector
// that a write to a socket happens before the read of it, as net's do.)
func (c *rawConn) readFD(closed bool) bool {
	for {
		p := c.space()
		n, err := syscall.Read(c.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false
		case err != nil:
			c.err = &net.OpError{Op: "read", Net: "tcp", Err: err}
			return true
		case n == 0:
			c.endOfStream()
			return true
		}
		c.received(n, int64(time.Since(c.epoch)))
		if c.done || c.err != nil {
			return true
		}
		if n < len(p) && !closed {
			// A short read drained the socket; anything later raises a new event.
			return false
		}
	}
}

// prepare (the epoll reader's path) takes a connection for p, lays out the request and
// registers the connection with the reader, all on the caller's goroutine; sendPrepared writes
// it and wait collects the answer. early (Begin) stamps StartNs before a dial, so that a
// connection opened for the request counts in its latency; otherwise (Prepare) StartNs is
// stamped by sendPrepared, just before the first byte is written.
func (t *streamTransport) prepare(p *Pending, early bool) {
	p.early = early
	if early {
		p.stamp()
	}
	c, reused, err := t.get(p.ctx)
	if err != nil {
		if !early {
			p.stamp() // the failed request's start: the dial that failed
		}
		p.beginErr = err
		return
	}
	p.conn, p.reused = c, reused
	c.buildRequest(t, p.path, p.req, p.c.auth, p.body)
	c.begin(p.epoch, p.resp)
	if err := t.ep.register(c); err != nil {
		c.resp = nil
		p.beginErr = err
		return
	}
	p.prepared = true
}

// sendPrepared stamps StartNs (unless Begin's early stamp stands for a new connection) and
// writes what the socket takes of the request now; waitSent writes the rest.
func (t *streamTransport) sendPrepared(p *Pending) {
	p.sent, p.prepared = true, false
	if !p.early || p.reused {
		p.stamp()
	}
	c := p.conn
	c.wpos = 0
	if err := c.writeNow(); err != nil {
		p.beginErr = err
	}
}

// discard releases a prepared request that was never written: its connection goes back to the
// pool unless the reader ended the (never asked) response first, which means that the peer
// closed it.
func (t *streamTransport) discard(p *Pending) {
	p.prepared = false
	c := p.conn
	finished := c.stopReading()
	t.ep.unregister(c)
	c.resp = nil
	p.conn = nil
	if finished {
		c.closeConn()
		return
	}
	t.put(c)
}

// waitSent is wait for a request that begin sent through the epoll reader.
func (t *streamTransport) waitSent(p *Pending) error {
	ctx := p.ctx
	c := p.conn
	if c == nil {
		return p.beginErr // no connection could be had
	}
	if !p.sent {
		c.closeConn()
		return p.beginErr
	}
	err := p.beginErr
	if err == nil {
		err = c.writeFD(ctx)
	}
	var answered bool
	if err != nil {
		// The request did not go out whole: its error is the answer, as in exchange.
		c.stopReading()
		t.ep.unregister(c)
		c.resp = nil
	} else {
		select {
		case <-c.finished:
		case <-ctx.Done():
			if !c.stopReading() {
				err = ctx.Err()
			}
		}
		t.ep.unregister(c)
		answered = c.answered
		err = c.end(err)
	}
	if err == nil && c.reusable {
		t.put(c)
	} else {
		c.closeConn()
	}
	if err == nil || !p.reused || answered || ctx.Err() != nil {
		return err
	}
	// The second and last attempt, as in do: a new connection cannot have been closed while idle.
	if c, err = t.dial(ctx); err != nil {
		return err
	}
	_, err = t.send(ctx, c, p.epoch, p.path, p.req, p.c.auth, p.body, p.resp)
	return err
}
