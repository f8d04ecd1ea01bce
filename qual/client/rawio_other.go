//go:build !linux

package client

import (
	"context"
	"net"
	"time"
)

// Without epoll every connection is read through Go's poller (rawhttp.go); these stand-ins
// let the shared code name the Linux reader, which newEpoller never returns here.

type epoller struct{}

type epollConn struct{}

func newEpoller() *epoller { return nil }

func adoptRawConn(*net.TCPConn) (*rawConn, error) { panic("client: no epoll reader on this platform") }

func (*epoller) exchange(context.Context, *rawConn, time.Time, *Response) (bool, error) {
	panic("client: no epoll reader on this platform")
}

func (c *rawConn) aliveFD() bool { return false }

func (c *rawConn) closeFD() {}

func (*streamTransport) prepare(*Pending, bool) { panic("client: no epoll reader on this platform") }

func (*streamTransport) sendPrepared(*Pending) { panic("client: no epoll reader on this platform") }

func (*streamTransport) discard(*Pending) { panic("client: no epoll reader on this platform") }

func (*streamTransport) waitSent(*Pending) error { panic("client: no epoll reader on this platform") }
