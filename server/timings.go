package server

import "strconv"

// appendTimings appends `,"timings":{...}`: llama.cpp's server timings (prompt_n, prompt_ms,
// prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_token_ms,
// predicted_per_second) plus queue_ms, preprocess_ms and vision_ms, all computed from the request's
// record, so that a client of any OpenAI library sees what qual-server records:
//
//	prompt_n      = input_tokens
//	prompt_ms     = task_ttft_ns (engine added to first token: the prefill step)
//	predicted_n   = output_tokens (all choices)
//	predicted_ms  = task_wall_ns - task_ttft_ns (the decode steps after the first token)
//	queue_ms      = queue_wait_ns
//	preprocess_ms = preprocess_ns (chat template, tokenization, image processing)
//	vision_ms     = vision_ns (the engine's vision tower and projector, within prompt_ms; only
//	                for requests with images whose engine measures it)
//
// llama.cpp asks for them with the request field timings_per_token; so does qual-server.
func (q *reqState) appendTimings(b []byte) []byte {
	r := &q.rec
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	promptMs := ms(r.TaskTTFTNs)
	predMs := ms(r.TaskWallNs - r.TaskTTFTNs)
	if r.TaskWallNs == 0 {
		predMs = 0
	}
	num := func(b []byte, key string, v float64) []byte {
		b = append(b, ',', '"')
		b = append(b, key...)
		b = append(b, '"', ':')
		return strconv.AppendFloat(b, v, 'g', -1, 64)
	}
	per := func(ms float64, n int) (perTok, perSec float64) {
		if n <= 0 || ms <= 0 {
			return 0, 0
		}
		return ms / float64(n), 1e3 * float64(n) / ms
	}
	b = append(b, `,"timings":{"prompt_n":`...)
	b = strconv.AppendInt(b, int64(r.InputTokens), 10)
	b = num(b, "prompt_ms", promptMs)
	pt, ps := per(promptMs, r.InputTokens)
	b = num(b, "prompt_per_token_ms", pt)
	b = num(b, "prompt_per_second", ps)
	b = append(b, `,"predicted_n":`...)
	b = strconv.AppendInt(b, int64(r.OutputTokens), 10)
	b = num(b, "predicted_ms", predMs)
	dt, ds := per(predMs, r.OutputTokens)
	b = num(b, "predicted_per_token_ms", dt)
	b = num(b, "predicted_per_second", ds)
	b = num(b, "queue_ms", ms(r.QueueWaitNs))
	b = num(b, "preprocess_ms", ms(r.PreprocessNs))
	if r.VisionNs > 0 {
		b = num(b, "vision_ms", ms(r.VisionNs))
	}
	return append(b, '}')
}
