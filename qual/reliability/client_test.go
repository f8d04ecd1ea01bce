package reliability

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelqual/modelqual/server/record"
)

// client is every scenario's HTTP client; its timeout turns a hang into a lost request.
var client = &http.Client{Timeout: 90 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// outcome is how one request ended, as its client saw it.
type outcome struct {
	id        string
	status    int
	answered  bool // the whole answer: a 2xx body, or a stream through [DONE] without an error event
	serverErr bool // an error the server sent: a non-2xx body or a stream's error event
	reached   bool // the server answered at all (headers came back), so it owes a record
	cancelled bool // the client gave up on purpose
	err       error
}

// lost: neither the answer nor an error from the server, and not the client's own doing.
func (o outcome) lost() bool { return !o.answered && !o.serverErr && !o.cancelled }

// send posts one completion. cancelAfterFirst makes the client drop a stream after its
// first event (the disconnect storm).
func send(ctx context.Context, base, id, body string, stream, cancelAfterFirst bool) outcome {
	o := outcome{id: id}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.reached = resp.StatusCode, true
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		o.serverErr = strings.Contains(string(b), `"error"`)
		if !o.serverErr {
			o.err = fmt.Errorf("status %d without an error body: %.200s", resp.StatusCode, b)
		}
		return o
	}
	if !stream {
		b, err := io.ReadAll(resp.Body)
		o.err = err
		o.answered = err == nil && strings.Contains(string(b), `"choices"`)
		return o
	}
	r := bufio.NewReader(resp.Body)
	done := false
	for {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			data := strings.TrimSpace(strings.TrimPrefix(line, "data: "))
			switch {
			case data == "[DONE]":
				done = true
			case strings.HasPrefix(data, `{"error"`):
				o.serverErr = true
			case cancelAfterFirst:
				o.cancelled = true
				return o
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				o.err = err
			}
			break
		}
	}
	o.answered = done && !o.serverErr && o.err == nil
	return o
}

// result collects a scenario's outcomes from many goroutines.
type result struct {
	mu   sync.Mutex
	outs []outcome
}

func (r *result) add(o outcome) {
	r.mu.Lock()
	r.outs = append(r.outs, o)
	r.mu.Unlock()
}

// lost counts lost requests, with the first few for the failure message.
func (r *result) lost() (int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	var ex []string
	for _, o := range r.outs {
		if o.lost() {
			n++
			if len(ex) < 5 {
				ex = append(ex, fmt.Sprintf("%s: status %d, err %v", o.id, o.status, o.err))
			}
		}
	}
	return n, ex
}

// recordsLost counts the requests that reached the server without exactly one record.
func (r *result) recordsLost(path string) (int, []string, error) {
	counts, err := readRecords(path)
	if err != nil {
		return 0, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	var ex []string
	for _, o := range r.outs {
		if o.reached && counts[o.id] != 1 {
			n++
			if len(ex) < 5 {
				ex = append(ex, fmt.Sprintf("%s: %d records", o.id, counts[o.id]))
			}
		}
	}
	return n, ex, nil
}

// readRecords counts the server's records per request id.
func readRecords(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec record.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			continue // a torn line is no record
		}
		counts[rec.RequestID]++
	}
	return counts, sc.Err()
}

// fire runs total requests over conc goroutines; next builds request i.
func fire(conc, total int, next func(i int) outcome, r *result) {
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r.add(next(i))
			}
		}()
	}
	for i := 0; i < total; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
}

// health reads /health's worker pids.
func workerPIDs(base string) ([]int, error) {
	resp, err := client.Get(base + "/health")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var h struct {
		PIDs []int `json:"worker_pids"`
	}
	return h.PIDs, json.NewDecoder(resp.Body).Decode(&h)
}

// metric reads one unlabelled-or-exact series from /metrics (0 when absent).
func metric(base, series string) float64 {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}
