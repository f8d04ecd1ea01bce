package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rawConn dials the server; rcvbuf > 0 shrinks the socket's receive buffer before connecting,
// so a client that stops reading fills the server's send path quickly.
func (s *testServer) rawConn(t *testing.T, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		if rcvbuf <= 0 {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedBy waits (up to limit, far above the server's timeouts) for the server to close c,
// returning what it sent before closing.
func closedBy(t *testing.T, c net.Conn, limit time.Duration) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) { // a reset: closed with our bytes unread
		t.Fatalf("the server did not close the connection within %v: %v (got %q)", limit, err, b)
	}
	return string(b)
}

// TestSlowAndIdleClients: a client that trickles its body, stalls mid-body, idles on a
// keep-alive connection or stops reading a stream is closed, and counted; a connection past
// --max-conns gets a 503; a stream the client reads outlives --write-timeout many times over.
func TestSlowAndIdleClients(t *testing.T) {
	const maxConns = 6
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--body-timeout", "1s", "--write-timeout", "1s",
		"--idle-timeout", "1s", "--max-conns", fmt.Sprint(maxConns))
	const body = `{"prompt":"Hello","max_tokens":2}`
	head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))

	t.Run("long stream read by its client", func(t *testing.T) {
		// 150 tokens at 20 ms a step: about 3 s of streaming under a 1 s write timeout.
		resp := s.openStream(context.Background(), "/v1/completions", `{"prompt":"Hello","max_tokens":150,"stream":true}`)
		events := sseEvents(t, resp.Body)
		resp.Body.Close()
		if n := len(events); n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], `"finish_reason":"length"`) {
			t.Fatalf("stream cut: ends with %q", events[max(0, len(events)-2):])
		}
	})

	t.Run("body stalled mid-way", func(t *testing.T) {
		c := s.rawConn(t, 0)
		if _, err := io.WriteString(c, head+body[:5]); err != nil {
			t.Fatal(err)
		}
		got := closedBy(t, c, 20*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, "body_timeout") {
			t.Fatalf("stalled body answered %q, want 408 body_timeout", got)
		}
	})

	t.Run("body trickled a byte at a time", func(t *testing.T) {
		c := s.rawConn(t, 0)
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		go func() {
			for i := 0; i < len(body)-1; i++ { // never the last byte
				if _, err := io.WriteString(c, body[i:i+1]); err != nil {
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
		got := closedBy(t, c, 20*time.Second)
		if !strings.HasPrefix(got, "HTTP/1.1 408") {
			t.Fatalf("trickled body answered %q, want 408", got)
		}
	})

	t.Run("idle keep-alive connection", func(t *testing.T) {
		c := s.rawConn(t, 0)
		if _, err := io.WriteString(c, head+body); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("keep-alive request: %d", resp.StatusCode)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if n, err := br.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle keep-alive connection: read %d bytes, %v; want the server to close it", n, err)
		}
	})

	t.Run("streams whose client stops reading", func(t *testing.T) {
		// Socket buffers on loopback absorb megabytes, more than one stream of this context
		// holds; so the client pipelines many long streams on one connection (served in
		// turn) and reads none of them, on a server without step delay.
		fast := startServer(t, mockBundle(t, 0), "--write-timeout", "1s")
		c := fast.rawConn(t, 4096)
		sb := `{"prompt":"Hello","max_tokens":4000,"stream":true,"ignore_eos":true}`
		var reqs strings.Builder
		for i := 0; i < 40; i++ {
			fmt.Fprintf(&reqs, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: stops-reading-%d\r\nContent-Length: %d\r\n\r\n%s", i, len(sb), sb)
		}
		go func() { _, _ = io.WriteString(c, reqs.String()) }()
		eventually(t, "the server to cut the client that stopped reading", 120*time.Second, func() bool {
			return fast.metric("qual_server_connections_closed_total", `{reason="write_timeout"}`) >= 1
		})
		eventually(t, "the cut stream to free its slot", 10*time.Second, func() bool {
			return fast.metric("qual_server_engine_slots_in_use", "") == 0
		})
		fast.stop()
		cut := 0
		for _, r := range fast.readRecords() {
			if strings.HasPrefix(r.RequestID, "stops-reading-") && r.ErrorType == "write_timeout" {
				cut++
				if r.FinishReason != "cancelled" || r.Status != 200 {
					t.Errorf("record of the cut stream: %+v", r)
				}
			}
		}
		if cut != 1 {
			t.Errorf("%d records of streams cut for write_timeout, want 1", cut)
		}
	})

	t.Run("connection cap", func(t *testing.T) {
		// Silent new connections hold their slots for the 10 s header timeout; keep opening
		// them until one is refused. Idle keep-alive connections of earlier requests may
		// still hold a slot or two, so the refusal comes at most maxConns connections in.
		var refused string
		opened := 0
		var conns []net.Conn
		for i := 0; i <= maxConns && refused == ""; i++ {
			c := s.rawConn(t, 0)
			conns = append(conns, c)
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			b, _ := io.ReadAll(c)
			if len(b) > 0 {
				refused = string(b)
			} else {
				opened++
			}
		}
		if !strings.HasPrefix(refused, "HTTP/1.1 503") || !strings.Contains(refused, "too_many_connections") {
			t.Fatalf("after %d silent connections the next got %q, want 503 too_many_connections", opened, refused)
		}
		if opened > maxConns {
			t.Fatalf("%d connections were open before one was refused; --max-conns is %d", opened, maxConns)
		}
		for _, c := range conns {
			c.Close()
		}
		// Slots come back as the server notices the closes; a request refused meanwhile
		// reads as 0 here, never as 1 (the request answering counts itself).
		eventually(t, "the closed connections' slots to come back", 10*time.Second, func() bool {
			return s.metric("qual_server_open_connections", "") == 1
		})
		if st, _, b := s.post("/v1/completions", body); st != 200 {
			t.Fatalf("request after the cap was lifted: %d %s", st, b)
		}
	})

	for _, reason := range []string{"read_timeout", "idle_timeout", "conn_limit"} {
		if v := s.metric("qual_server_connections_closed_total", `{reason="`+reason+`"}`); v < 1 {
			t.Errorf("qual_server_connections_closed_total{reason=%q} = %v, want >= 1", reason, v)
		}
	}
}

// get sends a GET with optional headers and returns status and body.
func (s *testServer) get(path string, hdr ...string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+path, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAPIKeySources: pprof answers only with the key; the key can come from a file or the
// environment instead of the command line, and no served page shows it.
func TestAPIKeySources(t *testing.T) {
	const key = "k3y-from-file-0123456789"
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, mockBundle(t, 0), "--pprof", "--api-key-file", file)
	auth := []string{"Authorization", "Bearer " + key}
	for _, p := range []string{"/debug/pprof/cmdline", "/debug/pprof/", "/debug/pprof/goroutine?debug=1"} {
		if st, b := s.get(p); st != 401 || !strings.Contains(b, "invalid_api_key") {
			t.Errorf("GET %s without the key: %d %q, want 401", p, st, b)
		}
		st, b := s.get(p, auth...)
		if st != 200 || strings.Contains(b, key) {
			t.Errorf("GET %s with the key: %d, key shown: %v", p, st, strings.Contains(b, key))
		}
	}
	if st, b := s.get("/debug/pprof/cmdline", auth...); !strings.Contains(b, "--api-key-file") {
		t.Errorf("cmdline %d %q does not look like qual-server's command line", st, b)
	}
	if st, _, b := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`, auth...); st != 200 {
		t.Fatalf("completion with the key from the file: %d %s", st, b)
	}
	if strings.Contains(s.log.String(), key) {
		t.Error("the API key appears in qual-server's log")
	}
	if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.cmd.Process.Pid)); err != nil || strings.Contains(string(cl), key) {
		t.Errorf("qual-server's /proc cmdline (what ps shows) holds the key (%v)", err)
	}

	// On the command line, the key is redacted from the served command line.
	s2 := startServer(t, mockBundle(t, 0), "--pprof", "--api-key", key)
	if st, b := s2.get("/debug/pprof/cmdline", auth...); st != 200 || strings.Contains(b, key) || !strings.Contains(b, "REDACTED") {
		t.Errorf("cmdline with --api-key: %d %q, want the key redacted", st, b)
	}

	// From the environment: required, and not inherited by the workers.
	t.Setenv("QUAL_SERVER_API_KEY", key)
	s3 := startServer(t, mockBundle(t, 0))
	if st, _, _ := s3.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 401 {
		t.Errorf("without the key from %s: %d, want 401", "QUAL_SERVER_API_KEY", st)
	}
	if st, _, b := s3.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`, auth...); st != 200 {
		t.Errorf("with the key from the environment: %d %s", st, b)
	}
	for _, pid := range s3.workerPIDs(t) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(env), key) {
			t.Errorf("worker %d inherited the API key in its environment", pid)
		}
	}

	// Two sources at once are refused rather than one silently winning.
	out, err := exec.Command(serverBin, "--bundle", mockBundle(t, 0), "--model-name", "m", "--api-key-file", file).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "more than once") {
		t.Errorf("key in the environment and in --api-key-file: %v %s, want a refusal", err, out)
	}
}

// TestNoWorkerFailsFast: when no worker can start (the bundle was replaced under the server),
// requests get 503 naming the reason at once rather than waiting, /health says why, and
// service resumes once a worker starts again.
func TestNoWorkerFailsFast(t *testing.T) {
	orig := mockBundle(t, 0)
	path := copyBundle(t, orig)
	s := startServer(t, path)
	other, err := os.ReadFile(mockBundle(t, time.Millisecond)) // valid, another digest
	if err != nil {
		t.Fatal(err)
	}
	replace := func(b []byte) {
		if err := os.WriteFile(path+".new", b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	replace(other)
	s.killWorker(t, 1)
	const why = "the file was replaced"
	eventually(t, "a failed replacement", 30*time.Second, func() bool { return strings.Contains(s.log.String(), why) })

	client := &http.Client{Timeout: 20 * time.Second} // far beyond "at once"; a hang fails here
	resp, err := client.Post(s.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hi","max_tokens":2}`))
	if err != nil {
		t.Fatalf("request with no worker: %v (want a 503 at once)", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), "no_worker") || !strings.Contains(string(b), why) {
		t.Fatalf("request with no worker: %d %s, want 503 no_worker naming the reason", resp.StatusCode, b)
	}
	if st, body := s.get("/health"); st != 503 || !strings.Contains(body, why) {
		t.Fatalf("/health with no worker: %d %s, want 503 with the reason", st, body)
	}

	good, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	replace(good)
	eventually(t, "a worker to start on the restored bundle", 60*time.Second, func() bool {
		return s.metric("qual_server_workers_ready", "") == 1
	})
	if st, _, body := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 200 {
		t.Fatalf("after a worker started again: %d %s", st, body)
	}
}

// TestDrainDeadline: during a drain new connections get 503 shutting_down; at the drain
// deadline a stream ends with a drain_timeout error event and a non-streaming request with
// 503, and both records say "drain" rather than blaming the client.
func TestDrainDeadline(t *testing.T) {
	s := startServer(t, mockBundle(t, 20*time.Millisecond), "--drain-timeout", "2s")
	resp := s.openStream(context.Background(), "/v1/completions", `{"prompt":"Hello","max_tokens":2000,"stream":true}`, "X-Request-Id", "drain-stream")
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := readEvent(r); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status int
		body   string
	}
	plain := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/completions", strings.NewReader(`{"prompt":"Hello","max_tokens":2000}`))
		req.Header.Set("X-Request-Id", "drain-plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			plain <- answer{0, err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		plain <- answer{resp.StatusCode, string(b)}
	}()
	eventually(t, "the non-streaming request to be admitted", 10*time.Second, func() bool {
		return s.metric("qual_server_engine_slots_in_use", "") == 2
	})
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// A new connection during the drain is answered, not refused.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var st int
	var b []byte
	eventually(t, "the drain to begin", 5*time.Second, func() bool {
		resp, err := fresh.Post(s.url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hi","max_tokens":2}`))
		if err != nil {
			t.Fatalf("new connection during the drain: %v; want 503", err)
		}
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		st = resp.StatusCode
		return st != 200
	})
	if st != 503 || !strings.Contains(string(b), "shutting_down") {
		t.Fatalf("new request during the drain: %d %s, want 503 shutting_down", st, b)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("stream at the drain deadline: %v (want it ended by an error event, not cut)", err)
	}
	events := parseSSE(t, string(rest))
	if n := len(events); n < 2 || events[n-1] != "[DONE]" || !strings.Contains(events[n-2], "drain_timeout") {
		t.Fatalf("stream at the drain deadline ended with %q", events[max(0, len(events)-2):])
	}
	if a := <-plain; a.status != 503 || !strings.Contains(a.body, "drain_timeout") {
		t.Fatalf("non-streaming request at the drain deadline: %d %s, want 503 drain_timeout", a.status, a.body)
	}
	<-s.exited
	if s.exitErr != nil {
		t.Fatalf("exit after drain: %v, want status 0", s.exitErr)
	}
	seen := 0
	for _, rec := range s.readRecords() {
		if rec.RequestID == "drain-stream" || rec.RequestID == "drain-plain" {
			seen++
			if rec.FinishReason != "drain" || rec.ErrorType != "drain_timeout" {
				t.Errorf("record %s: finish_reason %q error_type %q, want drain / drain_timeout", rec.RequestID, rec.FinishReason, rec.ErrorType)
			}
		}
	}
	if seen != 2 {
		t.Errorf("%d records of the two drained requests", seen)
	}
}

// chatBody builds a chat request of n messages (user and assistant in turn) with the given
// content each, and extra top-level JSON fields.
func chatBody(n int, content, extra string) string {
	var b strings.Builder
	b.WriteString(`{"messages":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `{"role":%q,"content":%q}`, role, content)
	}
	b.WriteString(`],"max_tokens":1` + extra + `}`)
	return b.String()
}

// TestChatLimits: caps on messages and content bytes, a context check before the template
// renders, and chat_template_kwargs cannot replace the messages.
func TestChatLimits(t *testing.T) {
	s := startServer(t, qwenBundle(t), "--max-chat-bytes", "200000")
	_, body := s.get("/v1/models")
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &models); err != nil || len(models.Data) != 1 || models.Data[0].MaxModelLen < 64 {
		t.Fatalf("/v1/models: %s (%v)", body, err)
	}
	ctxLen := models.Data[0].MaxModelLen
	check := func(what, body string, status int, wants ...string) {
		t.Helper()
		st, _, b := s.post("/v1/chat/completions", body)
		if st != status {
			t.Errorf("%s: %d %s, want %d", what, st, b, status)
			return
		}
		for _, w := range wants {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s: %s lacks %q", what, b, w)
			}
		}
	}
	// 100,000 messages (what took 1.8 GB of memory in four requests before the cap).
	check("100000 messages", chatBody(100000, "hi", ""), 400, `"param":"messages"`, "--max-messages")
	check("too many content bytes", chatBody(3, strings.Repeat("x", 100000), ""), 400, `"param":"messages[2].content"`, "--max-chat-bytes")
	check("kwargs replacing messages", chatBody(1, "hi", `,"chat_template_kwargs":{"messages":[{"role":"user","content":"other"}]}`), 400,
		`"param":"chat_template_kwargs.messages"`)
	check("kwargs replacing add_generation_prompt", chatBody(1, "hi", `,"chat_template_kwargs":{"add_generation_prompt":false}`), 400,
		`"param":"chat_template_kwargs.add_generation_prompt"`)
	// Far over the context: refused by the count before rendering.
	word := strings.Repeat(" hello", ctxLen/8)
	check("conversation over the context", chatBody(40, word, ""), 400, "context_length_exceeded", "before the chat template")
	// More content bytes than the context has tokens, but fewer tokens: counted, not refused.
	check("long but fitting conversation", chatBody(2, strings.Repeat(" the", ctxLen/8), `,"chat_template_kwargs":{"enable_thinking":false}`), 200)
	// Just over after rendering: the exact check after the template still refuses it.
	check("over only with the template", chatBody(1, strings.Repeat(" the", ctxLen-3), ""), 400, "context_length_exceeded")
	check("next valid request", chatBody(1, "hi", `,"chat_template_kwargs":{"enable_thinking":false}`), 200)
}

// TestRecordsFailLoudly: --records must be a regular file (or a new path) on a real
// filesystem, and a record that cannot be written is counted, turns /health and every later
// request into errors, and makes the exit status 1.
func TestRecordsFailLoudly(t *testing.T) {
	dir := t.TempDir()
	for path, want := range map[string]string{
		"/dev/full":     "not a regular file",
		"/proc/version": "",
		dir:             "not a regular file",
	} {
		out, err := exec.Command(serverBin, "--bundle", mockBundle(t, 0), "--model-name", "m", "--records", path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--records") || !strings.Contains(string(out), want) {
			t.Errorf("--records %s: %v %s, want a refusal naming --records", path, err, out)
		}
	}

	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is needed to make the records file unwritable mid-run")
	}
	s := startServer(t, mockBundle(t, 0))
	if st, _, b := s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`); st != 200 {
		t.Fatalf("first request: %d %s", st, b)
	}
	fi, err := os.Stat(s.records)
	if err != nil {
		t.Fatal(err)
	}
	// The file may grow by about two records more, then writes fail with EFBIG.
	if out, err := exec.Command(prlimit, "--pid", fmt.Sprint(s.cmd.Process.Pid), fmt.Sprintf("--fsize=%d", fi.Size()+1500)).CombinedOutput(); err != nil {
		t.Fatalf("prlimit: %v %s", err, out)
	}
	var st int
	var b []byte
	var answered []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("rec-%d", i)
		if st, _, b = s.post("/v1/completions", `{"prompt":"Hi","max_tokens":2}`, "X-Request-Id", id); st != 200 {
			break
		}
		answered = append(answered, id)
	}
	if st != 500 || !strings.Contains(string(b), "records_write_failed") {
		t.Fatalf("requests after the records file stopped growing: last %d %s, want 500 records_write_failed", st, b)
	}
	if v := s.metric("qual_server_record_write_errors_total", ""); v < 1 {
		t.Errorf("qual_server_record_write_errors_total = %v, want >= 1", v)
	}
	if hst, hb := s.get("/health"); hst != 503 || !strings.Contains(hb, "records_failing") {
		t.Errorf("/health with failing records: %d %s", hst, hb)
	}
	s.stop()
	if s.exitErr == nil {
		t.Error("qual-server exited 0 though records were lost")
	}
	// The record is written before the answer, so every request answered 200 has one; the
	// one whose record failed was answered 500.
	have := map[string]int{}
	for _, r := range s.readRecords() {
		have[r.RequestID]++
	}
	for _, id := range answered {
		if have[id] != 1 {
			t.Errorf("request %s was answered 200 but has %d records", id, have[id])
		}
	}
}

// TestLargeBodyReadSlowly: a /mq/v1/logits answer far larger than one --write-timeout can carry
// to a client that reads at a steady pace arrives whole (the deadline is re-armed per chunk),
// and the next request on a fresh connection answers. Before writeBody, the body went in one
// Write under one deadline and a slow reader of a long prompt's logits was cut mid-body.
func TestLargeBodyReadSlowly(t *testing.T) {
	s := startServer(t, qwenBundle(t), "--write-timeout", "1s")
	ids := make([]string, 24)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	body := `{"prompt_token_ids":[` + strings.Join(ids, ",") + `]}`
	c := s.rawConn(t, 64<<10)
	fmt.Fprintf(c, "POST /mq/v1/logits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		t.Fatalf("read the response head: %v", err)
	}
	// 24 positions x 151,936 float32s, base64: about 19.4 MB, read 512 KiB every 80 ms (about
	// 3 s in all, three times the write timeout, so one deadline for the whole body would cut
	// it; each 1 MiB chunk crosses in about 160 ms, a sixth of the timeout, so a loaded CI
	// machine that delays the reader does not).
	var got []byte
	buf := make([]byte, 512<<10)
	for {
		n, err := io.ReadFull(resp.Body, buf)
		got = append(got, buf[:n]...)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("after %d bytes: %v", len(got), err)
			}
			break
		}
		time.Sleep(80 * time.Millisecond)
	}
	var out struct {
		VocabSize int    `json:"vocab_size"`
		Positions int    `json:"positions"`
		Data      string `json:"data"`
	}
	if err := json.Unmarshal(got, &out); err != nil {
		t.Fatalf("the body was cut: %d bytes that do not parse (%v)", len(got), err)
	}
	if want := 4 * out.VocabSize * out.Positions; out.Positions != len(ids) || len(out.Data) != (want+2)/3*4 {
		t.Fatalf("logits body: %d positions, %d base64 bytes (want %d positions, %d bytes)", out.Positions, len(out.Data), len(ids), (want+2)/3*4)
	}
	if st, _, b := s.post("/mq/v1/logits", `{"prompt_token_ids":[9707]}`); st != 200 {
		t.Fatalf("the next request: %d %.200s", st, b)
	}
}
