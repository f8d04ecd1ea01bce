package reliability

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/qual/launch"
)

// row is one line of the suite's table.
type row struct {
	scenario, load, faults string
	requestsLost           int
	recordsLost            int
}

var (
	rowsMu sync.Mutex
	rows   []row
)

func addRow(r row) {
	rowsMu.Lock()
	rows = append(rows, r)
	rowsMu.Unlock()
}

// mockBundle is the mock family's bundle with a per-step delay (fixtures cache).
func mockBundle(delay time.Duration) string {
	p, err := fixtures.MockBundle("", delay)
	Expect(err).NotTo(HaveOccurred())
	return p
}

// start launches qual-server on bundle through the process launcher and registers its stop.
// A stop that fails (exit status not 0) fails the spec unless allowFailedStop.
func start(bundle string, allowFailedStop bool, args ...string) *launch.Endpoint {
	ep, err := launch.Process(launch.WithBundle(bundle), launch.WithModel("mock"), launch.WithRunDir(GinkgoT().TempDir()),
		launch.WithStartupTimeout(60*time.Second), launch.WithArgs(args...)).Start(context.Background())
	if ep != nil {
		DeferCleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := ep.Stop(ctx); err != nil && !allowFailedStop {
				Fail(fmt.Sprintf("stop qual-server: %v", err))
			}
		})
	}
	Expect(err).NotTo(HaveOccurred())
	return ep
}

// stopNow stops the server (so its records file is complete) and returns its error.
func stopNow(ep *launch.Endpoint) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return ep.Stop(ctx)
}

// finish checks a scenario's losses, adds its row, and fails the spec on any loss.
func finish(ep *launch.Endpoint, res *result, scenario, load, faults string) {
	lost, lostEx := res.lost()
	recLost, recEx, err := res.recordsLost(ep.RecordsPath)
	Expect(err).NotTo(HaveOccurred())
	addRow(row{scenario, load, faults, lost, recLost})
	Expect(lost).To(BeZero(), "requests lost: %v", lostEx)
	Expect(recLost).To(BeZero(), "records lost: %v", recEx)
}

const streamBody = `{"prompt":"Hello","max_tokens":%d,"ignore_eos":true,"stream":true}`

var _ = Describe("qual-server reliability", Label("reliability"), Ordered, ContinueOnFailure, func() {
	BeforeAll(func() {
		if !enabled() {
			Skip("the reliability suite runs with --label-filter=reliability (make reliability)")
		}
	})

	AfterAll(func() {
		rowsMu.Lock()
		defer rowsMu.Unlock()
		var b strings.Builder
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "scenario\tload\tfaults\trequests lost\trecords lost")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", r.scenario, r.load, r.faults, r.requestsLost, r.recordsLost)
		}
		tw.Flush()
		fmt.Fprint(os.Stdout, "\n"+b.String())
		AddReportEntry("reliability table", b.String())
		if dir := os.Getenv("ARTIFACTS"); dir != "" {
			_ = os.MkdirAll(dir, 0o755)
			_ = os.WriteFile(filepath.Join(dir, "reliability.txt"), []byte(b.String()), 0o644)
		}
	})

	It("closes slow and idle clients while serving the others", func() {
		ep := start(mockBundle(0), false, "--body-timeout", "1s", "--write-timeout", "1s", "--idle-timeout", "1s")
		addr := strings.TrimPrefix(ep.BaseURL, "http://")
		res := &result{}
		var faults sync.WaitGroup
		const slow = 10
		for i := 0; i < slow; i++ {
			faults.Add(2)
			go func() { // a body that stalls after a few bytes
				defer faults.Done()
				id := fmt.Sprintf("stall-%d", i)
				res.add(rawSlowBody(addr, id, false))
			}()
			go func() { // a body trickled a byte at a time
				defer faults.Done()
				id := fmt.Sprintf("trickle-%d", i)
				res.add(rawSlowBody(addr, id, true))
			}()
			faults.Add(1)
			go func() { // a keep-alive connection left idle
				defer faults.Done()
				c, err := net.Dial("tcp", addr)
				if err == nil {
					_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
					_, _ = io.Copy(io.Discard, c) // returns when the server closes it
					c.Close()
				}
			}()
		}
		fire(8, 200, func(i int) outcome {
			return send(context.Background(), ep.BaseURL, fmt.Sprintf("slowcase-ok-%d", i), fmt.Sprintf(streamBody, 32), true, false)
		}, res)
		faults.Wait()
		Expect(metric(ep.BaseURL, `qual_server_connections_closed_total{reason="read_timeout"}`)).To(BeNumerically(">=", 2*slow))
		Expect(stopNow(ep)).To(Succeed())
		finish(ep, res, "slow clients", "8 streams x 200 requests", fmt.Sprintf("%d stalled bodies, %d trickled bodies, %d idle connections", slow, slow, slow))
	})

	It("survives a disconnect storm", func() {
		ep := start(mockBundle(10*time.Millisecond), false)
		res := &result{}
		fire(50, 1000, func(i int) outcome {
			return send(context.Background(), ep.BaseURL, fmt.Sprintf("storm-%d", i), fmt.Sprintf(streamBody, 200), true, true)
		}, res)
		Eventually(func() float64 { return metric(ep.BaseURL, "qual_server_engine_slots_in_use") }, 30*time.Second, 50*time.Millisecond).Should(BeZero())
		fire(8, 40, func(i int) outcome {
			return send(context.Background(), ep.BaseURL, fmt.Sprintf("after-storm-%d", i), fmt.Sprintf(streamBody, 16), true, false)
		}, res)
		Expect(stopNow(ep)).To(Succeed())
		finish(ep, res, "disconnect storm", "1000 streams at 50, then 40", "every storm client leaves after its first event")
	})

	It("fails only the killed worker's requests, each with an error", func() {
		ep := start(mockBundle(10*time.Millisecond), false, "--workers", "2")
		res := &result{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			fire(16, 160, func(i int) outcome {
				return send(context.Background(), ep.BaseURL, fmt.Sprintf("kill-%d", i), fmt.Sprintf(streamBody, 50), i%2 == 0, false)
			}, res)
		}()
		time.Sleep(time.Second) // let the load reach both workers before the fault
		pids, err := workerPIDs(ep.BaseURL)
		Expect(err).NotTo(HaveOccurred())
		Expect(pids).To(HaveLen(2))
		Expect(syscall.Kill(pids[0], syscall.SIGKILL)).To(Succeed())
		<-done
		Eventually(func() float64 { return metric(ep.BaseURL, "qual_server_workers_ready") }, 60*time.Second, 50*time.Millisecond).Should(Equal(2.0))
		Expect(stopNow(ep)).To(Succeed())
		finish(ep, res, "worker SIGKILL", "16 clients x 160 requests, 2 workers", "SIGKILL of one worker mid-run")
	})

	It("holds a short soak", func() {
		ep := start(mockBundle(time.Millisecond), false)
		res := &result{}
		deadline := time.Now().Add(20 * time.Second)
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					body := fmt.Sprintf(`{"prompt":"Hello","max_tokens":%d,"ignore_eos":true,"stream":%v}`, 8+i%24, i%2 == 0)
					res.add(send(context.Background(), ep.BaseURL, fmt.Sprintf("soak-%d-%d", w, i), body, i%2 == 0, false))
				}
			}()
		}
		wg.Wait()
		Expect(metric(ep.BaseURL, "qual_server_engine_slots_in_use")).To(BeZero())
		Expect(stopNow(ep)).To(Succeed())
		finish(ep, res, "short soak", fmt.Sprintf("16 clients for 20 s (%d requests)", len(res.outs)), "none")
	})

	It("drains honestly", func() {
		ep := start(mockBundle(20*time.Millisecond), false, "--drain-timeout", "2s")
		res := &result{}
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(2)
			go func() { // runs past the drain deadline
				defer wg.Done()
				res.add(send(context.Background(), ep.BaseURL, fmt.Sprintf("drain-long-%d", i), fmt.Sprintf(streamBody, 1000), true, false))
			}()
			go func() { // finishes within it
				defer wg.Done()
				res.add(send(context.Background(), ep.BaseURL, fmt.Sprintf("drain-short-%d", i), fmt.Sprintf(streamBody, 40), true, false))
			}()
		}
		Eventually(func() float64 { return metric(ep.BaseURL, "qual_server_engine_slots_in_use") }, 10*time.Second, 10*time.Millisecond).Should(Equal(16.0))
		Expect(syscall.Kill(ep.PID, syscall.SIGTERM)).To(Succeed())
		Eventually(func() int {
			resp, err := client.Get(ep.BaseURL + "/health")
			if err != nil {
				return 0
			}
			resp.Body.Close()
			return resp.StatusCode
		}, 10*time.Second, 10*time.Millisecond).Should(Equal(503), "/health during the drain")
		for i := 0; i < 10; i++ { // new requests during the drain
			res.add(send(context.Background(), ep.BaseURL, fmt.Sprintf("drain-new-%d", i), fmt.Sprintf(streamBody, 4), true, false))
		}
		wg.Wait()
		Expect(stopNow(ep)).To(Succeed())
		refused := 0
		for _, o := range res.outs {
			if strings.HasPrefix(o.id, "drain-new-") && o.status == 503 {
				refused++
			}
		}
		Expect(refused).To(Equal(10), "new requests during the drain answered 503")
		finish(ep, res, "drain", "8 long + 8 short streams, 10 new requests", "SIGTERM, 2 s drain deadline")
	})

	It("refuses tampered bundles", func() {
		good, err := os.ReadFile(mockBundle(0))
		Expect(err).NotTo(HaveOccurred())
		dir := GinkgoT().TempDir()
		for _, c := range []struct {
			name   string
			tamper func([]byte) []byte
		}{
			{"header byte", func(b []byte) []byte { b[200] ^= 0x20; return b }},
			{"tensor data byte", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }},
			{"truncated", func(b []byte) []byte { return b[:len(b)-4096] }},
		} {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".mqb")
			Expect(os.WriteFile(path, c.tamper(append([]byte(nil), good...)), 0o644)).To(Succeed())
			ep, err := launch.Process(launch.WithBundle(path), launch.WithRunDir(GinkgoT().TempDir()),
				launch.WithStartupTimeout(60*time.Second)).Start(context.Background())
			if ep != nil {
				_ = stopNow(ep)
			}
			Expect(err).To(HaveOccurred(), "a bundle with a %s was served", c.name)
			GinkgoWriter.Printf("%s refused: %.300s\n", c.name, err)
		}
		addRow(row{"bundle tampering", "3 starts", "header byte, tensor data byte, truncation: each refused at start", 0, 0})
	})

	It("fails loudly on unwritable records", func() {
		ep, err := launch.Process(launch.WithBundle(mockBundle(0)), launch.WithRunDir(GinkgoT().TempDir()),
			launch.WithStartupTimeout(60*time.Second), launch.WithArgs("--records", "/dev/full")).Start(context.Background())
		if ep != nil {
			_ = stopNow(ep)
		}
		Expect(err).To(HaveOccurred(), "qual-server started with --records /dev/full")

		prlimit, lerr := exec.LookPath("prlimit")
		if lerr != nil {
			Skip("prlimit (util-linux) is needed to make the records file unwritable mid-run")
		}
		ep = start(mockBundle(0), true)
		res := &result{}
		fire(4, 20, func(i int) outcome {
			return send(context.Background(), ep.BaseURL, fmt.Sprintf("rec-before-%d", i), fmt.Sprintf(streamBody, 8), true, false)
		}, res)
		st, err := os.Stat(ep.RecordsPath)
		Expect(err).NotTo(HaveOccurred())
		out, err := exec.Command(prlimit, "--pid", fmt.Sprint(ep.PID), fmt.Sprintf("--fsize=%d", st.Size()+2048)).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		fire(4, 60, func(i int) outcome {
			return send(context.Background(), ep.BaseURL, fmt.Sprintf("rec-after-%d", i), fmt.Sprintf(streamBody, 8), true, false)
		}, res)
		Expect(metric(ep.BaseURL, "qual_server_record_write_errors_total")).To(BeNumerically(">=", 1))
		Expect(stopNow(ep)).NotTo(Succeed(), "exit status 0 though records were lost")
		// A request answered with an error (500 records_write_failed, or a stream's error
		// event when its own record failed) was told; a lost record is a success without one.
		counts, err := readRecords(ep.RecordsPath)
		Expect(err).NotTo(HaveOccurred())
		lost, recLost, refused := 0, 0, 0
		for _, o := range res.outs {
			if o.lost() {
				lost++
			}
			if o.status == 500 {
				refused++
			}
			if o.answered && counts[o.id] != 1 {
				recLost++
			}
		}
		addRow(row{"unwritable records", "80 streams", fmt.Sprintf("--records /dev/full refused at start; file size capped mid-run (%d later requests refused with 500)", refused), lost, recLost})
		Expect(lost).To(BeZero())
		Expect(recLost).To(BeZero(), "requests answered with success but without a record")
		Expect(refused).To(BeNumerically(">", 0))
	})
})

// rawSlowBody sends a request whose body never completes: stalled after 5 bytes, or trickled
// a byte every 200 ms. The server must answer 408 and close.
func rawSlowBody(addr, id string, trickle bool) outcome {
	o := outcome{id: id}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		o.err = err
		return o
	}
	defer c.Close()
	body := fmt.Sprintf(streamBody, 8)
	head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\nContent-Length: %d\r\n\r\n", id, len(body))
	if _, err := io.WriteString(c, head+body[:5]); err != nil {
		o.err = err
		return o
	}
	if trickle {
		go func() {
			for i := 5; i < len(body)-1; i++ {
				time.Sleep(200 * time.Millisecond)
				if _, err := io.WriteString(c, body[i:i+1]); err != nil {
					return
				}
			}
		}()
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, _ := io.ReadAll(c)
	o.reached = len(b) > 0
	if strings.HasPrefix(string(b), "HTTP/1.1 408") && strings.Contains(string(b), `"error"`) {
		o.status, o.serverErr = 408, true
	} else {
		o.err = fmt.Errorf("slow body answered %.120q", b)
	}
	return o
}
