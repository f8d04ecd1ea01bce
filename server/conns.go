package server

import (
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Slow and idle clients. net/http's own ReadTimeout and WriteTimeout are blankets over a whole
// request: a ReadTimeout also expires the background read that watches a streaming client,
// which cancels the request mid-generation, and a WriteTimeout cuts every stream longer than
// it. So qual-server sets deadlines itself: the request body must arrive within
// --body-timeout, each write must complete within --write-timeout (re-armed before every
// write, so a long stream that the client keeps reading is never cut), a keep-alive
// connection may idle for --idle-timeout, and at most --max-conns connections are open; a
// connection past the cap is answered 503 and closed rather than left waiting in the kernel's
// backlog. Every connection closed for one of these reasons is counted in
// qual_server_connections_closed_total{reason}.

// Reasons a connection is closed by the server for the client's behaviour (metric label).
const (
	closedIdle      = "idle_timeout"  // nothing sent on a new or keep-alive connection
	closedSlowRead  = "read_timeout"  // request headers or body not sent in time
	closedSlowWrite = "write_timeout" // the client stopped reading the response
	closedConnLimit = "conn_limit"    // --max-conns connections were already open
)

// DefaultMaxConns is --max-conns' default: far above the concurrency a load profile sweeps
// (hundreds of streams), far below the process's file-descriptor limit.
const DefaultMaxConns = 4096

// headerTimeout bounds how long a client may take to send request headers.
const headerTimeout = 10 * time.Second

// connListener caps open connections and wraps each accepted one in a trackedConn.
type connListener struct {
	net.Listener
	s     *Server
	slots chan struct{}
}

func newConnListener(ln net.Listener, s *Server) *connListener {
	return &connListener{Listener: ln, s: s, slots: make(chan struct{}, s.cfg.MaxConns)}
}

func (l *connListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			l.s.m.openConns.Inc()
			return &trackedConn{Conn: c, l: l}, nil
		default:
			l.s.m.connsClosed.WithLabelValues(closedConnLimit).Inc()
			go refuseConn(c, l.s.cfg.MaxConns)
		}
	}
}

// refuseConn answers a connection past the cap with a 503 in OpenAI's error shape and closes
// it, so the client learns why instead of waiting.
func refuseConn(c net.Conn, limit int) {
	defer c.Close()
	body := (&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "too_many_connections",
		Message: "the server has " + strconv.Itoa(limit) + " connections open (--max-conns); retry later or reuse a keep-alive connection"}).body()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, _ = c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)))
	// Read what the client already sent before closing, so the close is a FIN rather than a
	// reset that could discard the answer before the client reads it.
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		var buf [4096]byte
		for {
			if _, err := c.Read(buf[:]); err != nil {
				return
			}
		}
	}
}

// trackedConn notices deadlines that expire on a client's account. net/http expires a read
// deadline on purpose to stop its background read (a deadline in the past); that is not the
// client's fault and is not counted.
type trackedConn struct {
	net.Conn
	l        *connListener
	aborting atomic.Bool // the read deadline was set in the past
	idle     atomic.Bool // between requests (or before the first)
	counted  atomic.Bool
	release  sync.Once
}

func (c *trackedConn) SetReadDeadline(t time.Time) error {
	c.aborting.Store(!t.IsZero() && t.Before(time.Now()))
	return c.Conn.SetReadDeadline(t)
}

func (c *trackedConn) SetDeadline(t time.Time) error {
	c.aborting.Store(!t.IsZero() && t.Before(time.Now()))
	return c.Conn.SetDeadline(t)
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.idle.Store(false) // a request is arriving: a slow one is a slow read, not an idle client
	}
	if err != nil && !c.aborting.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
		if c.idle.Load() {
			c.closedFor(closedIdle)
		} else {
			c.closedFor(closedSlowRead)
		}
	}
	return n, err
}

func (c *trackedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		c.closedFor(closedSlowWrite)
	}
	return n, err
}

func (c *trackedConn) closedFor(reason string) {
	if c.counted.CompareAndSwap(false, true) {
		c.l.s.m.connsClosed.WithLabelValues(reason).Inc()
	}
}

func (c *trackedConn) Close() error {
	c.release.Do(func() {
		<-c.l.slots
		c.l.s.m.openConns.Dec()
	})
	return c.Conn.Close()
}

// connState keeps each trackedConn's idle flag (http.Server.ConnState).
func connState(c net.Conn, st http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		tc.idle.Store(true)
	case http.StateActive:
		tc.idle.Store(false)
	}
}

// armWrite gives the next write to the client --write-timeout to complete. Deadlines persist
// on a keep-alive connection, so every path that writes arms it first.
func (q *reqState) armWrite() {
	if q.s.cfg.WriteTimeout > 0 {
		_ = q.rc.SetWriteDeadline(time.Now().Add(q.s.cfg.WriteTimeout))
	}
}
