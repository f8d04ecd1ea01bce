package server

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/modelqual/modelqual/server/wire"
)

// MaxTopLogprobs is the most alternatives a request may ask per token (OpenAI's limit for
// /v1/completions `logprobs` and chat `top_logprobs`; the engine's limit too).
const MaxTopLogprobs = wire.MaxTopLogprobs

// Logprobs are the model's raw distribution: log_softmax of the fp32 logits, before
// temperature, top-k and top-p (vLLM's default "raw_logprobs"), so that a served logprob can
// be compared with transformers' log_softmax of the same logits whatever the sampling asked.

// tokLP is one consumed output token with its logprobs.
type tokLP struct {
	tok int32
	lp  *wire.Logprobs // nil only if the worker sent none (a bug the gates catch)
}

// lpState is a request's logprobs bookkeeping: tokens consumed and not yet answered, and the
// text_offset of the next token (code points of the token strings before it, as vLLM counts).
type lpState struct {
	pending []tokLP
	offset  int
	tb      []byte // scratch: a token's bytes
}

// add queues a consumed token's logprobs for the next chunk (or the whole answer).
func (l *lpState) add(tok int32, lp *wire.Logprobs) { l.pending = append(l.pending, tokLP{tok, lp}) }

// appendLogprob appends a log-probability as a JSON number; -inf (a masked logit) is -9999.0,
// OpenAI's stand-in, since JSON has no infinities.
func appendLogprob(b []byte, x float32) []byte {
	if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
		return append(b, "-9999.0"...)
	}
	return strconv.AppendFloat(b, float64(x), 'g', -1, 32)
}

// tokenText is a token's bytes as a JSON string's content: valid UTF-8 (an incomplete
// character becomes U+FFFD, as a per-token decode gives it); `bytes` carries the raw bytes.
func (g *gen) tokenBytes(id int32) []byte {
	l := g.lp
	l.tb = g.s.tok.TokenBytes(l.tb[:0], id)
	return l.tb
}

// appendTokenName appends the JSON string that names token id in logprobs: its text (bytes b),
// or "token_id:<id>" when the request asked for return_tokens_as_token_ids.
func (g *gen) appendTokenName(dst []byte, id int32, b []byte) []byte {
	if g.req.TokensAsIDs {
		dst = strconv.AppendInt(append(dst, `"token_id:`...), int64(id), 10)
		return append(dst, '"')
	}
	return appendTokenString(dst, b)
}

// appendTokenString appends the JSON string of token bytes b.
func appendTokenString(dst, b []byte) []byte {
	if utf8.Valid(b) {
		return appendJSONString(dst, string(b))
	}
	return appendJSONString(dst, string(appendLossyUTF8(nil, b)))
}

// appendLossyUTF8 replaces invalid sequences of b with U+FFFD.
func appendLossyUTF8(dst, b []byte) []byte {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			dst = append(dst, "\uFFFD"...)
			b = b[1:]
			continue
		}
		dst = append(dst, b[:n]...)
		b = b[n:]
	}
	return dst
}

func runeLen(b []byte) int {
	if utf8.Valid(b) {
		return utf8.RuneCount(b)
	}
	return utf8.RuneCount(appendLossyUTF8(nil, b))
}

func appendBytesArray(dst, b []byte) []byte {
	dst = append(dst, '[')
	for i, c := range b {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(c), 10)
	}
	return append(dst, ']')
}

// appendLogprobs appends the logprobs object of the pending tokens and clears them:
// /v1/completions {"tokens","token_logprobs","top_logprobs","text_offset"} (top_logprobs a
// dict per token of the requested alternatives plus the chosen token, as OpenAI documents:
// up to logprobs+1 entries), chat {"content":[{"token","logprob","bytes","top_logprobs":[...]}]}.
func (g *gen) appendLogprobs(b []byte) []byte {
	l := g.lp
	toks := l.pending
	lp := func(t tokLP) *wire.Logprobs {
		if t.lp == nil {
			return &wire.Logprobs{Logprob: float32(math.NaN())}
		}
		return t.lp
	}
	if g.req.Chat {
		b = append(b, `{"content":[`...)
		for i, t := range toks {
			if i > 0 {
				b = append(b, ',')
			}
			p := lp(t)
			tb := g.tokenBytes(t.tok)
			b = append(b, `{"token":`...)
			b = g.appendTokenName(b, t.tok, tb)
			b = append(b, `,"logprob":`...)
			b = appendLogprob(b, p.Logprob)
			b = append(b, `,"bytes":`...)
			b = appendBytesArray(b, tb)
			b = append(b, `,"top_logprobs":[`...)
			for j, c := range p.Top[:min(len(p.Top), g.req.TopLogprobs)] {
				if j > 0 {
					b = append(b, ',')
				}
				cb := g.tokenBytes(c.ID)
				b = append(b, `{"token":`...)
				b = g.appendTokenName(b, c.ID, cb)
				b = append(b, `,"logprob":`...)
				b = appendLogprob(b, c.Logprob)
				b = append(b, `,"bytes":`...)
				b = appendBytesArray(b, cb)
				b = append(b, '}')
			}
			b = append(b, "]}"...)
		}
		l.pending = l.pending[:0]
		return append(b, "]}"...)
	}
	b = append(b, `{"tokens":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = g.appendTokenName(b, t.tok, g.tokenBytes(t.tok))
	}
	b = append(b, `],"token_logprobs":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLogprob(b, lp(t).Logprob)
	}
	b = append(b, `],"top_logprobs":[`...)
	var seen []string
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		p := lp(t)
		b = append(b, '{')
		seen = seen[:0]
		entry := func(id int32, x float32) {
			s := "token_id:" + strconv.Itoa(int(id))
			if !g.req.TokensAsIDs {
				s = string(appendLossyUTF8(nil, g.tokenBytes(id)))
			}
			for _, o := range seen {
				if o == s { // two ids with one text: a JSON object keeps one key, the likelier
					return
				}
			}
			if len(seen) > 0 {
				b = append(b, ',')
			}
			seen = append(seen, s)
			b = appendJSONString(b, s)
			b = append(b, ':')
			b = appendLogprob(b, x)
		}
		chosen := false
		for _, c := range p.Top[:min(len(p.Top), g.req.TopLogprobs)] {
			entry(c.ID, c.Logprob)
			chosen = chosen || c.ID == t.tok
		}
		if !chosen {
			entry(t.tok, p.Logprob)
		}
		b = append(b, '}')
	}
	b = append(b, `],"text_offset":[`...)
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(l.offset), 10)
		l.offset += runeLen(g.tokenBytes(t.tok))
	}
	l.pending = l.pending[:0]
	return append(b, "]}"...)
}
