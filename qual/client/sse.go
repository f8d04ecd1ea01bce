package client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// eventDecoder turns an SSE body, fed in pieces as they arrive, into resp: it stamps each
// content event with the arrival of its first byte, drops events without content (METRICS.md)
// and collects text, finish reason, usage and any error event. It is push-style (write is
// called with each piece and the time that piece arrived) so the raw HTTP/1.1 reader can run
// it inside its read callback, and the net/http path can feed it from Body.Read.
type eventDecoder struct {
	resp *Response
	// line holds a line that has not ended yet (copied: the bytes it came from are reused);
	// lineT is when its first byte arrived.
	line  []byte
	lineT int64
	// data holds the joined data lines of the current event; nData counts them.
	data  []byte
	nData int
	// evStart is the arrival of the current event's first field line (-1: none yet).
	evStart int64
	info    chunkInfo
	// The template: a stream's events differ from one another only inside their text string
	// (the id, model, created and the other fields repeat byte for byte). After an event whose
	// text is one string value, tmplPre holds its bytes up to and including that string's
	// opening quote and tmplSuf those from its closing quote on, and tmplInfo what the scan
	// found besides the text. An event that starts with tmplPre and ends with tmplSuf, with
	// one valid string between them, is the template with another string token in the same
	// place: valid JSON exactly when that string is, with the same fields. Only the string is
	// then scanned (str, as the full scan does), which is most of the client's parsing cost
	// per event saved. Anything else takes the full scan, which sets a new template.
	tmplPre, tmplSuf []byte
	tmplInfo         chunkInfo
	tmplOK           bool
	noTmpl           bool // tests: every event takes the full scan
}

func (d *eventDecoder) reset(resp *Response) {
	d.resp = resp
	d.line, d.data = d.line[:0], d.data[:0]
	d.nData, d.evStart = 0, -1
	d.tmplOK = false
}

// fromTemplate parses ev through the template if it fits (see eventDecoder), appending its
// text to resp.Text and filling d.info; it reports whether it did.
func (d *eventDecoder) fromTemplate(ev []byte) bool {
	pre, suf := d.tmplPre, d.tmplSuf
	if !d.tmplOK || len(ev) < len(pre)+len(suf) || !bytes.HasPrefix(ev, pre) || !bytes.HasSuffix(ev, suf) {
		return false
	}
	// The first unescaped quote after the opening one must be the suffix's own.
	j, sp := str(ev, len(pre)-1)
	if j != len(ev)-len(suf)+1 {
		return false
	}
	n0 := len(d.resp.Text)
	d.resp.Text = appendSpan(d.resp.Text, ev, sp)
	d.info = d.tmplInfo
	d.info.hasContent = len(d.resp.Text) > n0
	return true
}

// setTemplate makes ev, just parsed in full into d.info, the template when its text is one
// string value.
func (d *eventDecoder) setTemplate(ev []byte) {
	d.tmplOK = false
	if d.noTmpl || d.info.textStrings != 1 {
		return
	}
	sp := d.info.textSpan
	d.tmplPre = append(d.tmplPre[:0], ev[:sp.start]...)
	d.tmplSuf = append(d.tmplSuf[:0], ev[sp.end:]...)
	d.tmplInfo = d.info
	d.tmplOK = true
}

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
)

// write consumes body bytes p that arrived at t. p is not retained.
func (d *eventDecoder) write(p []byte, t int64) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(d.line) == 0 {
				d.lineT = t
			}
			d.line = append(d.line, p...)
			return
		}
		if len(d.line) == 0 {
			// The common case: the whole line arrived in this piece; no copy.
			d.handleLine(p[:i], t)
		} else {
			d.line = append(d.line, p[:i]...)
			d.handleLine(d.line, d.lineT)
			d.line = d.line[:0]
		}
		p = p[i+1:]
	}
}

// end finishes the body: a last line without a newline, then the pending event.
func (d *eventDecoder) end() {
	if len(d.line) > 0 {
		d.handleLine(d.line, d.lineT)
		d.line = d.line[:0]
	}
	d.flush()
}

// handleLine takes one line without its LF (a CR before it is dropped; a lone CR is kept as
// text, which the servers we target never send) that arrived at t.
func (d *eventDecoder) handleLine(l []byte, t int64) {
	if len(l) > 0 && l[len(l)-1] == '\r' {
		l = l[:len(l)-1]
	}
	if len(l) == 0 {
		d.flush()
		return
	}
	if bytes.HasPrefix(l, dataPrefix) {
		v := l[len(dataPrefix):]
		if len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		if d.evStart < 0 {
			d.evStart = t
		}
		// Several data lines are joined by a newline, as the SSE spec says.
		if d.nData == 0 {
			d.data = append(d.data[:0], v...)
		} else {
			d.data = append(append(d.data, '\n'), v...)
		}
		d.nData++
		return
	}
	if d.evStart < 0 && l[0] != ':' {
		d.evStart = t
	}
	// Comments (":...") and other fields (event:, id:, retry:) carry no data.
}

// flush dispatches the current event.
func (d *eventDecoder) flush() {
	if d.nData == 0 {
		d.evStart = -1
		return
	}
	ev, t := d.data, d.evStart
	d.nData, d.evStart = 0, -1
	ev = bytes.TrimSpace(ev)
	if len(ev) == 0 || bytes.Equal(ev, doneData) {
		return
	}
	resp, info := d.resp, &d.info
	if !d.fromTemplate(ev) {
		var ok bool
		if resp.Text, ok = parseChunk(ev, resp.Text, info); !ok {
			return
		}
		d.setTemplate(ev)
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

// streamReader is what readStream pools: a decoder and its read buffer.
type streamReader struct {
	dec eventDecoder
	buf []byte
}

// readBufSize is the read buffer of a stream (4 KiB keeps memory per stream small at high
// concurrency; longer lines are assembled in the decoder).
const readBufSize = 4096

var streamReaders = sync.Pool{New: func() any { return &streamReader{buf: make([]byte, readBufSize)} }}

// readStream reads an SSE body from r (net/http's path), stamping each read as it returns.
func readStream(body io.Reader, epoch time.Time, resp *Response) error {
	// Pooled: a stream's buffers would otherwise be allocated, and collected, per request.
	sr := streamReaders.Get().(*streamReader)
	defer func() {
		sr.dec.resp = nil
		streamReaders.Put(sr)
	}()
	d := &sr.dec
	d.reset(resp)
	var n int64
	for {
		k, err := body.Read(sr.buf)
		if k > 0 {
			n += int64(k)
			d.write(sr.buf[:k], int64(time.Since(epoch)))
		}
		if err != nil {
			resp.ResponseBytes = n
			if !errors.Is(err, io.EOF) {
				resp.EndNs = int64(time.Since(epoch))
				return fmt.Errorf("read event stream: %w", err)
			}
			break
		}
	}
	d.end()
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
	return wholeBody(buf.Bytes(), resp.EndNs, resp)
}

// wholeBody fills resp from a complete non-streaming body that ended arriving at end (its one
// content "chunk" is stamped then) and returns resp.Err.
func wholeBody(b []byte, end int64, resp *Response) error {
	var info chunkInfo
	var ok bool
	resp.Text, ok = parseChunk(b, resp.Text, &info)
	if !ok {
		resp.ErrBody = append([]byte(nil), b[:min(len(b), errBodyLimit)]...)
		resp.Err = &Error{Code: resp.Status, Type: "InvalidResponse", Message: "response body is not a JSON object"}
		return resp.Err
	}
	if info.hasContent {
		resp.ChunkNs = append(resp.ChunkNs, end)
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
