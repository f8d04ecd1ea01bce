package server_test

import (
	"context"
	"io"
	"testing"
)

// BenchmarkDecodeStep measures the engine's decode step (the worker's time around eng.Step,
// from qual_server_engine_step_duration_seconds{kind="decode"}) on qwen3-tiny with one worker
// and one thread, streaming and not, with the sampling held fixed in each pair: greedy
// (temperature 0) and temperature 1 (seeded). Issue 41 compared a greedy non-streaming run
// with a streaming run at the API's default temperature 1; the pairs here tell streaming's
// cost from sampling's.
//
// greedy-fulllogits is greedy on the host path (see below). The draw alone, narrowed against
// weighing the whole vocabulary, is native's BenchmarkSamplePlain.
func BenchmarkDecodeStep(b *testing.B) {
	narrowed := sharedServer(b, qwenBundle(b), "--workers", "1", "--max-batch", "8")
	for _, sampling := range []struct{ name, fields string }{
		{"greedy", `"temperature":0`},
		{"temp1", `"temperature":1,"seed":7`},
		// Greedy through the host path (a repetition penalty that changes no argmax here): the
		// engine computes the full fp32 logits row as for sampling, but draws nothing, so
		// temp1 minus this is the sampler's own cost and this minus greedy the LM head's.
		{"greedy-fulllogits", `"temperature":0,"repetition_penalty":1.000001`},
	} {
		s := narrowed
		for _, stream := range []bool{false, true} {
			name := sampling.name + "/plain"
			body := `{"prompt":"The capital of France is","max_tokens":64,"ignore_eos":true,` + sampling.fields
			if stream {
				name = sampling.name + "/stream"
				body += `,"stream":true`
			}
			body += "}"
			b.Run(name, func(b *testing.B) {
				sum0 := s.metric("qual_server_engine_step_duration_seconds_sum", `{kind="decode"}`)
				n0 := s.metric("qual_server_engine_step_duration_seconds_count", `{kind="decode"}`)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if stream {
						resp := s.openStream(context.Background(), "/v1/completions", body)
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							b.Fatalf("status %d", resp.StatusCode)
						}
					} else if st, _, out := s.post("/v1/completions", body); st != 200 {
						b.Fatalf("status %d %s", st, out)
					}
				}
				b.StopTimer()
				sum := s.metric("qual_server_engine_step_duration_seconds_sum", `{kind="decode"}`) - sum0
				n := s.metric("qual_server_engine_step_duration_seconds_count", `{kind="decode"}`) - n0
				if n == 0 {
					b.Fatal("no decode steps counted")
				}
				b.ReportMetric(sum/n*1e3, "ms/decode_step")
			})
		}
	}
}
