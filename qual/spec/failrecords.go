package spec

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/onsi/ginkgo/v2"
)

// FailureRecordsInput is the input of FailureRecords and CheckFailureRecords.
type FailureRecordsInput struct {
	// API reaches a server started with a short --request-timeout (RequestTimeout), one batch
	// slot and a queue of one (--max-batch 1 --queue-depth 1), so long requests time out
	// and a burst overflows the queue.
	API *API
	// RecordsPath is that server's records file.
	RecordsPath string
	// MaxContext is the served context (an over-context prompt is one of the failures).
	MaxContext int
	// RequestTimeout is the server's --request-timeout; a request of MaxContext−8 tokens must
	// take longer.
	RequestTimeout time.Duration
}

// failureCase is one request the gate sends and the status it must end with.
type failureCase struct {
	name   string
	id     string
	status int // what the client saw (499: the client gave up)
	// cancelled: the client closed the connection. The record must say finish_reason
	// "cancelled" with an error_type; its status is 499, or 200 when a stream's headers
	// had gone out before the client left (as nginx logs it).
	cancelled bool
}

// CheckFailureRecords is FailureRecords' core: requests that fail every way a client meets
// (malformed JSON, a missing field, an unknown model, an over-context prompt, a refused
// control, a wrong method, an unknown route, a request timeout (504), a full queue (429), a
// stream the client closes, a request the client abandons before the answer) each leave
// exactly one server record whose status is the one the client saw (499 where the client
// closed the connection).
func CheckFailureRecords(ctx context.Context, in FailureRecordsInput) error {
	const fn = "spec.CheckFailureRecords"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: FailureRecordsInput.API is nil", fn)
	case in.RecordsPath == "":
		return fmt.Errorf("%s: FailureRecordsInput.RecordsPath is empty: the server's records are needed", fn)
	case in.MaxContext < 16:
		return fmt.Errorf("%s: FailureRecordsInput.MaxContext %d is too small", fn, in.MaxContext)
	case in.RequestTimeout <= 0:
		return fmt.Errorf("%s: FailureRecordsInput.RequestTimeout must be the server's --request-timeout", fn)
	}
	a := in.API
	longBody := func() map[string]any { return longRequest(a.Model, in.MaxContext) }
	over := make([]int, in.MaxContext+1)
	for i := range over {
		over[i] = 1 + i%50
	}
	var cases []failureCase
	var problems []string
	send := func(name, method, route string, body any, want int) {
		fc := failureCase{name: name, id: newRequestID("fail")}
		status, err := rawStatus(ctx, a, method, route, fc.id, body)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			return
		}
		fc.status = status
		if want != 0 && status != want {
			problems = append(problems, fmt.Sprintf("%s: HTTP %d, want %d", name, status, want))
		}
		cases = append(cases, fc)
	}
	send("malformed JSON", http.MethodPost, "/v1/completions", json.RawMessage(`{"prompt": `), http.StatusBadRequest)
	send("missing prompt", http.MethodPost, "/v1/completions", map[string]any{"model": a.Model, "max_tokens": 4}, http.StatusBadRequest)
	send("unknown model", http.MethodPost, "/v1/completions", map[string]any{"model": "no-such-model", "prompt": "hi", "max_tokens": 4}, http.StatusNotFound)
	send("over-context prompt", http.MethodPost, "/v1/completions", map[string]any{"model": a.Model, "prompt": over, "max_tokens": 4}, http.StatusBadRequest)
	send("refused control best_of=2", http.MethodPost, "/v1/completions", map[string]any{"model": a.Model, "prompt": "hi", "max_tokens": 4, "best_of": 2}, http.StatusBadRequest)
	send("wrong method", http.MethodGet, "/v1/completions", nil, http.StatusMethodNotAllowed)
	send("unknown route", http.MethodPost, "/v1/no-such-route", map[string]any{"model": a.Model}, http.StatusNotFound)
	send("request timeout", http.MethodPost, "/v1/completions", longBody(), http.StatusGatewayTimeout)

	// A burst of long requests over one batch slot and a queue of one: the overflow gets 429.
	burst := make([]failureCase, 4)
	var wg sync.WaitGroup
	for i := range burst {
		burst[i] = failureCase{name: fmt.Sprintf("burst request %d", i), id: newRequestID("fail-burst")}
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := rawStatus(ctx, a, http.MethodPost, "/v1/completions", burst[i].id, longBody())
			if err != nil {
				st = -1
			}
			burst[i].status = st
		}()
	}
	wg.Wait()
	saw429 := false
	for _, b := range burst {
		if b.status == -1 {
			problems = append(problems, b.name+": transport error")
			continue
		}
		saw429 = saw429 || b.status == http.StatusTooManyRequests
		cases = append(cases, b)
	}
	if !saw429 {
		problems = append(problems, fmt.Sprintf("a burst of %d long requests over --max-batch 1 --queue-depth 1 got no 429 (statuses %v)", len(burst), []int{burst[0].status, burst[1].status, burst[2].status, burst[3].status}))
	}

	// The client closes a stream after its first event, and abandons a request before its answer.
	id := newRequestID("fail-cancel-stream")
	if err := closeAfterFirstEvent(ctx, a, id, longBody()); err != nil {
		problems = append(problems, "cancelled stream: "+err.Error())
	} else {
		cases = append(cases, failureCase{name: "stream closed by the client", id: id, status: 499, cancelled: true})
	}
	id = newRequestID("fail-abandon")
	actx, cancel := context.WithTimeout(ctx, in.RequestTimeout/4)
	_, err := rawStatus(actx, a, http.MethodPost, "/v1/completions", id, longBody())
	cancel()
	if err == nil {
		problems = append(problems, "abandoned request: it finished within a quarter of the request timeout; nothing was abandoned")
	} else {
		cases = append(cases, failureCase{name: "request abandoned by the client", id: id, status: 499, cancelled: true})
	}

	ids := make([]string, len(cases))
	for i, c := range cases {
		ids[i] = c.id
	}
	recs, err := waitRecords(ctx, in.RecordsPath, ids)
	if err != nil {
		problems = append(problems, err.Error())
	}
	for _, c := range cases {
		rs := recs[c.id]
		switch {
		case len(rs) == 0:
			problems = append(problems, fmt.Sprintf("%s (request %s, HTTP %d): no server record", c.name, c.id, c.status))
		case len(rs) > 1:
			problems = append(problems, fmt.Sprintf("%s (request %s): %d server records, want exactly one", c.name, c.id, len(rs)))
		case c.cancelled && (rs[0].FinishReason != "cancelled" || rs[0].ErrorType == ""):
			problems = append(problems, fmt.Sprintf("%s (request %s): the record says finish_reason %q error_type %q, want \"cancelled\" with an error type", c.name, c.id, rs[0].FinishReason, rs[0].ErrorType))
		case c.cancelled && rs[0].Status != 499 && !(rs[0].Stream && rs[0].Status == http.StatusOK):
			problems = append(problems, fmt.Sprintf("%s (request %s): the record says status %d, want 499 (or 200 for a stream whose headers were sent)", c.name, c.id, rs[0].Status))
		case !c.cancelled && rs[0].Status != c.status:
			problems = append(problems, fmt.Sprintf("%s (request %s): the record says status %d, the client saw %d", c.name, c.id, rs[0].Status, c.status))
		case c.status >= 400 && rs[0].ErrorType == "":
			problems = append(problems, fmt.Sprintf("%s (request %s): the record of a failed request has no error_type", c.name, c.id))
		}
	}
	if len(problems) > 0 {
		return errors.New("failure records gate: failed requests must each leave exactly one record with their status:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// longRequest is the failure-records gate's long request: a greedy completion of
// maxContext−8 tokens that ignores end-of-sequence, the longest a server of that context serves.
func longRequest(model string, maxContext int) map[string]any {
	return map[string]any{"model": model, "prompt": []int{1, 2, 3, 4}, "max_tokens": maxContext - 8, "temperature": 0, "ignore_eos": true}
}

// FailureRequestTimeout is the --request-timeout the failure-records gate's server is started
// with, given how long its long request takes (TimeLongRequest): a quarter of that, so the long
// requests time out, the burst overflows the queue and the abandoned request is abandoned on any
// machine, however fast the model; at most 100 ms, at least 2 ms, in whole milliseconds.
func FailureRequestTimeout(long time.Duration) time.Duration {
	t := (long / 4).Truncate(time.Millisecond)
	return min(max(t, 2*time.Millisecond), 100*time.Millisecond)
}

// TimeLongRequest times the failure-records gate's long request on a (a server of the same
// bundle), the fastest of two runs, so FailureRequestTimeout can choose a timeout it outlasts.
func TimeLongRequest(ctx context.Context, a *API, maxContext int) (time.Duration, error) {
	best := time.Duration(0)
	for i := 0; i < 2; i++ {
		start := time.Now()
		status, err := rawStatus(ctx, a, http.MethodPost, "/v1/completions", newRequestID("fail-timing"), longRequest(a.Model, maxContext))
		if err != nil {
			return 0, fmt.Errorf("time the failure-records gate's long request: %w", err)
		}
		if status != http.StatusOK {
			return 0, fmt.Errorf("time the failure-records gate's long request: HTTP %d, want 200", status)
		}
		if d := time.Since(start); best == 0 || d < best {
			best = d
		}
	}
	return best, nil
}

// rawStatus sends one request with X-Request-Id id and returns the HTTP status, reading the
// whole body. body is JSON-encoded unless it is a json.RawMessage (sent as is, even malformed).
func rawStatus(ctx context.Context, a *API, method, route, id string, body any) (int, error) {
	var rd io.Reader
	if body != nil {
		raw, ok := body.(json.RawMessage)
		if !ok {
			var err error
			if raw, err = json.Marshal(body); err != nil {
				return 0, err
			}
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.BaseURL+route, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Request-Id", id)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.APIKey)
	}
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, route, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: read body: %w", method, route, err)
	}
	return resp.StatusCode, nil
}

// closeAfterFirstEvent starts a streamed completion, reads its first data event and closes
// the connection.
func closeAfterFirstEvent(ctx context.Context, a *API, id string, body map[string]any) error {
	body["stream"] = true
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, a.BaseURL+"/v1/completions", bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("X-Request-Id", id)
	req.Header.Set("Content-Type", "application/json")
	if a.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.APIKey)
	}
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d before any event", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") {
			cancel() // close the connection with the stream still running
			return nil
		}
	}
	return fmt.Errorf("the stream ended before its first event: %v", sc.Err())
}

// FailureRecords asserts that every failed, cancelled or timed-out request leaves exactly one
// record with its status (CheckFailureRecords).
func FailureRecords(ctx context.Context, input func() FailureRecordsInput) {
	ginkgo.It("leaves exactly one record with its status for every 4xx, 5xx, cancelled and timed-out request", Gate(GateContract), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckFailureRecords(c, input()))
	})
}
