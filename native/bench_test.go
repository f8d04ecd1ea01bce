package native

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

// BenchmarkDecode measures decode throughput through the Go API and the C ABI: one op is one
// engine step, which decodes one token for each of the batch's sequences. Prefill steps are
// excluded (timer stopped), so tokens/s is decode only. "greedy" is temperature 0; "t=1" is
// OpenAI's default temperature 1 (full-vocabulary softmax sampling), what a client that sets
// no temperature gets.
func BenchmarkDecode(b *testing.B) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		for _, batch := range []int{1, 8} {
			for _, temp := range []float32{0, 1} {
				mode := "greedy"
				if temp > 0 {
					mode = "t=1"
				}
				b.Run(fmt.Sprintf("%s/batch=%d/%s", name, batch, mode), func(b *testing.B) {
					benchDecode(b, name, batch, Sampling{MaxNewTokens: 200, IgnoreEOS: true, Temperature: temp, Seed: 1})
				})
			}
		}
	}
}

func benchDecode(b *testing.B, name string, batch int, s Sampling) {
	e := openEngine(b, name, Params{MaxBatch: batch})
	refill := func() {
		for e.Active() < batch {
			if _, err := e.Add(testPrompts[e.Active()%len(testPrompts)], s); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := e.Step(nil); err != nil { // prefill + first token
			b.Fatal(err)
		}
	}
	refill()
	tokens := 0
	count := func(ev Event) {
		if ev.Token >= 0 {
			tokens++
		}
	}
	b.ResetTimer()
	start := time.Now()
	var paused time.Duration
	for i := 0; i < b.N; i++ {
		if e.Active() < batch {
			b.StopTimer()
			t0 := time.Now()
			refill()
			paused += time.Since(t0)
			b.StartTimer()
		}
		if _, err := e.Step(count); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(start) - paused
	b.ReportMetric(float64(tokens)/el.Seconds(), "tokens/s")
}

// BenchmarkBundleOpen measures opening (and fully validating: sha256 of every section and of
// the tensor data) a bundle.
func BenchmarkBundleOpen(b *testing.B) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		b.Run(name, func(b *testing.B) {
			path := testBundle(b, name).Path()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				bb, err := bundle.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				bb.Close()
			}
		})
	}
}

// BenchmarkEngineOpen measures native.Open on an opened bundle (weights are used in place).
func BenchmarkEngineOpen(b *testing.B) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		b.Run(name, func(b *testing.B) {
			bb := testBundle(b, name)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				e, err := Open(bb, Params{})
				if err != nil {
					b.Fatal(err)
				}
				e.Close()
			}
		})
	}
}

// rssBytes returns the process's resident set, after a garbage collection that returns free
// Go heap to the OS, so the scavenger's timing does not move the figures by megabytes.
func rssBytes(b *testing.B) int64 {
	debug.FreeOSMemory()
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Skipf("no /proc/self/statm: %v", err)
	}
	f := strings.Fields(string(raw))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// BenchmarkLoadRSS reports the resident memory a loaded, warmed engine adds to the process
// (bundle.Open + native.Open + an 8-sequence decode), against the bytes of its weights. The
// bundle is mapped afresh, so its pages count even when another mapping already holds them.
// "greedy" decodes at temperature 0, which reads the LM head's int8 screen and only the rows of
// the head it rescores (plus the page-cache folios around them); "t=1" samples, which reads the
// whole head every step and materialises the batch's logits: the resident set of an engine
// that has served any sampling request. In the tiny fixtures the LM head is 95-99% of the
// weights, so the int8 screen's own size is ~0.28x of them (by arithmetic: a byte per fp32
// weight plus scales); the measured resident set is larger and depends on how many page-cache
// folios around the rescored rows the kernel maps (1.2-1.4x on one machine, 0.83x on another
// for qwen3-tiny greedy). MODELQUAL_BENCH_SHAPE=1 adds the
// Qwen3-0.6B-shaped fixture (2.4 GB of fp32 weights, generated once into the fixture cache, 4
// tokens per sequence), where the head is a quarter of the weights as in the real model.
func BenchmarkLoadRSS(b *testing.B) {
	names := []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny}
	if os.Getenv("MODELQUAL_BENCH_SHAPE") == "1" {
		names = append(names, fixtures.Qwen3Shape)
	}
	for _, name := range names {
		tokens := 16
		if name == fixtures.Qwen3Shape {
			tokens = 4
		}
		for _, temp := range []float32{0, 1} {
			mode := "greedy"
			if temp > 0 {
				mode = "t=1"
			}
			b.Run(name+"/"+mode, func(b *testing.B) {
				benchLoadRSS(b, name, Sampling{MaxNewTokens: tokens, IgnoreEOS: true, Temperature: temp, Seed: 1})
			})
		}
	}
}

func benchLoadRSS(b *testing.B, name string, s Sampling) {
	path := testBundle(b, name).Path()
	var ratio float64
	for i := 0; i < b.N; i++ {
		before := rssBytes(b)
		bb, err := bundle.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		e, err := Open(bb, Params{MaxBatch: 8})
		if err != nil {
			b.Fatal(err)
		}
		for j := 0; j < 8; j++ {
			if _, err := e.Add(testPrompts[j%len(testPrompts)], s); err != nil {
				b.Fatal(err)
			}
		}
		for e.Active() > 0 {
			if _, err := e.Step(nil); err != nil {
				b.Fatal(err)
			}
		}
		after := rssBytes(b)
		var weights int64
		for _, t := range bb.Header().Tensors {
			weights += t.Size
		}
		ratio = float64(after-before) / float64(weights)
		b.ReportMetric(float64(after-before)/(1<<20), "rss-MiB")
		b.ReportMetric(float64(weights)/(1<<20), "weights-MiB")
		e.Close()
		bb.Close()
	}
	b.ReportMetric(ratio, "rss/weights")
}
