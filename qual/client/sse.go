package client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// stampedReader is a small line reader over a response body that remembers when each
// read returned, so an SSE event is stamped with the arrival of its first byte rather than
// with the moment the scanner got to it.
type stampedReader struct {
	r     io.Reader
	epoch time.Time
	buf   []byte
	rd    int // next unread byte
	wr    int // end of data
	fills []fill
	n     int64 // bytes read from r
}

// fill says: bytes before end arrived by the read that returned at t.
type fill struct {
	end int
	t   int64
}

// readBufSize is the initial line buffer; it grows for longer lines.
const readBufSize = 4096

func (s *stampedReader) init(r io.Reader, epoch time.Time, buf []byte) {
	s.r, s.epoch = r, epoch
	if cap(buf) < readBufSize {
		buf = make([]byte, readBufSize)
	}
	s.buf = buf[:cap(buf)]
	s.rd, s.wr = 0, 0
	s.fills = s.fills[:0]
	s.n = 0
}

// stampAt returns the arrival time of the byte at buffer position p.
func (s *stampedReader) stampAt(p int) int64 {
	for _, f := range s.fills {
		if p < f.end {
			return f.t
		}
	}
	return int64(time.Since(s.epoch))
}

// more reads more data into the buffer, compacting or growing it as needed.
func (s *stampedReader) more() error {
	if s.rd > 0 {
		n := copy(s.buf, s.buf[s.rd:s.wr])
		shift := s.rd
		s.rd, s.wr = 0, n
		k := 0
		for _, f := range s.fills {
			if f.end-shift > 0 {
				s.fills[k] = fill{f.end - shift, f.t}
				k++
			}
		}
		s.fills = s.fills[:k]
	}
	if s.wr == len(s.buf) {
		nb := make([]byte, 2*len(s.buf))
		copy(nb, s.buf[:s.wr])
		s.buf = nb
	}
	for {
		n, err := s.r.Read(s.buf[s.wr:])
		if n > 0 {
			t := int64(time.Since(s.epoch))
			s.wr += n
			s.n += int64(n)
			s.fills = append(s.fills, fill{s.wr, t})
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// line returns the next line without its terminator (LF or CRLF; a lone CR is kept as
// text, which the servers we target never send), the arrival time of its first byte, and
// io.EOF at the end. The slice is valid until the next call.
func (s *stampedReader) line() ([]byte, int64, error) {
	start := s.rd
	scanned := s.rd
	for {
		if i := bytes.IndexByte(s.buf[scanned:s.wr], '\n'); i >= 0 {
			end := scanned + i
			s.rd = end + 1
			t := s.stampAt(start)
			l := s.buf[start:end]
			if len(l) > 0 && l[len(l)-1] == '\r' {
				l = l[:len(l)-1]
			}
			return l, t, nil
		}
		scanned = s.wr
		// more() compacts the buffer by s.rd (== start) bytes before reading.
		shift := s.rd
		err := s.more()
		start -= shift
		scanned -= shift
		if err != nil {
			if s.wr > start {
				// A last line without a newline.
				t := s.stampAt(start)
				l := s.buf[start:s.wr]
				s.rd = s.wr
				if errors.Is(err, io.EOF) {
					return l, t, nil
				}
				return l, t, err
			}
			return nil, 0, err
		}
	}
}

var readerPool = sync.Pool{New: func() any { return new(stampedReader) }}

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
)

// readStream reads an SSE body, stamping content events and collecting text, finish
// reason, usage and any error event into resp.
func readStream(body io.Reader, epoch time.Time, resp *Response) error {
	// Readers (their line buffer and fill list) are pooled across requests: a stream's
	// 4 KiB buffer would otherwise be allocated, and collected, once per request.
	sr := readerPool.Get().(*stampedReader)
	defer func() {
		sr.r = nil
		readerPool.Put(sr)
	}()
	sr.init(body, epoch, sr.buf)
	var data []byte // joined data lines of the current event (only when multi-line)
	nData := 0
	var evStart int64 = -1
	var info chunkInfo
	flush := func() {
		if nData == 0 {
			evStart = -1
			return
		}
		ev := data
		t := evStart
		nData, evStart = 0, -1
		ev = bytes.TrimSpace(ev)
		if len(ev) == 0 || bytes.Equal(ev, doneData) {
			return
		}
		var ok bool
		resp.Text, ok = parseChunk(ev, resp.Text, &info)
		if !ok {
			return
		}
		if info.hasContent {
			resp.ChunkNs = append(resp.ChunkNs, t)
		}
		if info.finishReason != "" {
			resp.FinishReason = info.finishReason
		}
		if info.hasUsage {
			resp.HasUsage = true
			resp.PromptTokens, resp.CompletionTokens = info.promptTokens, info.completionTokens
		}
		if info.hasError && resp.Err == nil {
			resp.Err = &Error{Code: info.errCode, Type: info.errType, Message: info.errMessage}
			if resp.Err.Type == "" {
				resp.Err.Type = "StreamError"
			}
			if resp.Err.Code == 0 {
				resp.Err.Code = 500
			}
		}
	}
	for {
		l, t, err := sr.line()
		if err != nil && !errors.Is(err, io.EOF) {
			resp.ResponseBytes = sr.n
			resp.EndNs = int64(time.Since(epoch))
			return fmt.Errorf("read event stream: %w", err)
		}
		if err != nil { // io.EOF
			flush()
			break
		}
		if len(l) == 0 {
			flush()
			continue
		}
		if bytes.HasPrefix(l, dataPrefix) {
			v := l[len(dataPrefix):]
			if len(v) > 0 && v[0] == ' ' {
				v = v[1:]
			}
			if evStart < 0 {
				evStart = t
			}
			// Copy: the line's bytes may be overwritten by the next read. Several data lines
			// are joined by a newline, as the SSE spec says.
			if nData == 0 {
				data = append(data[:0], v...)
			} else {
				data = append(append(data, '\n'), v...)
			}
			nData++
			continue
		}
		if evStart < 0 && l[0] != ':' {
			evStart = t
		}
		// Comments (":...") and other fields (event:, id:, retry:) carry no data.
	}
	resp.ResponseBytes = sr.n
	resp.EndNs = int64(time.Since(epoch))
	if resp.Err != nil {
		return resp.Err
	}
	return nil
}

// readWhole reads a non-streaming JSON body.
func readWhole(body io.Reader, epoch time.Time, resp *Response) error {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(body)
	resp.ResponseBytes = n
	resp.EndNs = int64(time.Since(epoch))
	if err != nil {
		return fmt.Errorf("read response body: %w", err)
	}
	var info chunkInfo
	var ok bool
	resp.Text, ok = parseChunk(buf.Bytes(), resp.Text, &info)
	if !ok {
		resp.ErrBody = append([]byte(nil), buf.Bytes()[:min(buf.Len(), errBodyLimit)]...)
		resp.Err = &Error{Code: resp.Status, Type: "InvalidResponse", Message: "response body is not a JSON object"}
		return resp.Err
	}
	if info.hasContent {
		resp.ChunkNs = append(resp.ChunkNs, resp.EndNs)
	}
	resp.FinishReason = info.finishReason
	if info.hasUsage {
		resp.HasUsage = true
		resp.PromptTokens, resp.CompletionTokens = info.promptTokens, info.completionTokens
	}
	if info.hasError {
		resp.Err = &Error{Code: info.errCode, Type: info.errType, Message: info.errMessage}
		return resp.Err
	}
	return nil
}
