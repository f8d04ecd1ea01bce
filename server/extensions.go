package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sort"
	"strconv"

	"github.com/modelqual/modelqual/server/wire"
)

// decodeObject parses a body that must be a JSON object whose keys are all in allowed.
func decodeObject(body []byte, allowed ...string) (map[string]json.RawMessage, *APIError) {
	t := bytes.TrimSpace(body)
	if len(t) == 0 || t[0] != '{' {
		return nil, badRequest("", "request body must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(t, &m); err != nil {
		return nil, badRequest("", "request body is not valid JSON: %v", err)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
outer:
	for _, k := range keys {
		for _, a := range allowed {
			if k == a {
				continue outer
			}
		}
		return nil, badRequest(k, "unknown field `%s`", k)
	}
	return m, nil
}

func (s *Server) checkModel(m map[string]json.RawMessage) *APIError {
	raw, ok := m["model"]
	if !ok {
		return nil
	}
	name, aerr := str(raw, "model")
	if aerr != nil {
		return aerr
	}
	if name != "" && name != s.cfg.ModelName {
		return s.unknownModel(name)
	}
	return nil
}

func decodeIDList(raw json.RawMessage, param string) ([]int32, *APIError) {
	var ids []int32
	if json.Unmarshal(raw, &ids) != nil {
		return nil, badRequest(param, "`%s` must be a list of integer token ids", param)
	}
	return ids, nil
}

// handleTokenize is vLLM's /tokenize: a prompt, or chat messages rendered with the model's
// template ("rendered" is our extension, so a harness can compare templates directly).
func (s *Server) handleTokenize(q *reqState) {
	body, ok := q.readBody()
	if !ok {
		return
	}
	m, aerr := decodeObject(body, "model", "prompt", "messages", "add_generation_prompt", "chat_template_kwargs", "add_special_tokens")
	if aerr == nil {
		aerr = s.checkModel(m)
	}
	if aerr != nil {
		q.fail(aerr)
		return
	}
	resp := map[string]any{"max_model_len": s.info.MaxContext}
	var text string
	switch {
	case m["prompt"] != nil && m["messages"] != nil:
		aerr = badRequest("messages", "send either `prompt` or `messages`, not both")
	case m["prompt"] != nil:
		text, aerr = str(m["prompt"], "prompt")
	case m["messages"] != nil:
		var msgs []Message
		var img *ImagePart
		if msgs, img, aerr = decodeMessages(m["messages"], ChatLimits{MaxMessages: s.cfg.MaxMessages, MaxContentBytes: s.cfg.MaxChatBytes}); aerr != nil {
			break
		}
		if img != nil {
			aerr = badRequest("messages", "this route renders text only; an image part is not supported here")
			break
		}
		addGen := true
		if raw, ok := m["add_generation_prompt"]; ok {
			if addGen, aerr = boolean(raw, "add_generation_prompt"); aerr != nil {
				break
			}
		}
		var kwargs map[string]any
		if raw, ok := m["chat_template_kwargs"]; ok && !isNull(raw) {
			if json.Unmarshal(raw, &kwargs) != nil {
				aerr = badRequest("chat_template_kwargs", "`chat_template_kwargs` must be an object")
				break
			}
		}
		if text, aerr = s.render(msgs, addGen, kwargs); aerr == nil {
			resp["rendered"] = text
		}
	default:
		aerr = badRequest("prompt", "`prompt` (a string) or `messages` is required")
	}
	if aerr == nil {
		if raw, ok := m["add_special_tokens"]; ok {
			_, aerr = boolean(raw, "add_special_tokens") // our tokenizers add none either way
		}
	}
	if aerr != nil {
		q.fail(aerr)
		return
	}
	ids := s.tok.Encode(text)
	if ids == nil {
		ids = []int32{}
	}
	q.rec.PromptSHA256, q.rec.PromptBytes, q.rec.InputTokens = sha256Hex([]byte(text)), int64(len(text)), len(ids)
	resp["tokens"], resp["count"] = ids, len(ids)
	q.writeJSON(http.StatusOK, resp)
}

func (s *Server) handleDetokenize(q *reqState) {
	body, ok := q.readBody()
	if !ok {
		return
	}
	m, aerr := decodeObject(body, "model", "tokens")
	if aerr == nil {
		aerr = s.checkModel(m)
	}
	var ids []int32
	if aerr == nil {
		if m["tokens"] == nil {
			aerr = badRequest("tokens", "`tokens` is required: a list of token ids")
		} else if ids, aerr = decodeIDList(m["tokens"], "tokens"); aerr == nil {
			aerr = s.checkIDs(ids, "tokens")
		}
	}
	if aerr != nil {
		q.fail(aerr)
		return
	}
	text := s.tok.Decode(ids)
	q.rec.InputTokens = len(ids)
	q.rec.OutputSHA256, q.rec.OutputBytes = sha256Hex([]byte(text)), int64(len(text))
	q.writeJSON(http.StatusOK, map[string]any{"prompt": text})
}

// handleLogits returns the engine's full-vocabulary logits at every prompt position, for the
// harness's parity gates (over HTTP, as it qualifies any deployment).
func (s *Server) handleLogits(q *reqState) {
	body, ok := q.readBody()
	if !ok {
		return
	}
	m, aerr := decodeObject(body, "model", "prompt_token_ids")
	if aerr == nil {
		aerr = s.checkModel(m)
	}
	var ids []int32
	if aerr == nil {
		if m["prompt_token_ids"] == nil {
			aerr = badRequest("prompt_token_ids", "`prompt_token_ids` is required: a non-empty list of token ids")
		} else if ids, aerr = decodeIDList(m["prompt_token_ids"], "prompt_token_ids"); aerr == nil {
			switch {
			case len(ids) == 0:
				aerr = badRequest("prompt_token_ids", "`prompt_token_ids` is empty")
			case len(ids) > s.info.MaxContext:
				aerr = badRequest("prompt_token_ids", "%d token ids exceed this model's context of %d", len(ids), s.info.MaxContext)
				aerr.Code = "context_length_exceeded"
			default:
				aerr = s.checkIDs(ids, "prompt_token_ids")
			}
		}
	}
	if aerr != nil {
		q.fail(aerr)
		return
	}
	q.rec.InputTokens = len(ids)
	q.rec.PromptSHA256, q.rec.PromptBytes = sha256Hex(idsBytes(ids)), int64(4*len(ids))
	t := s.pool.newTask()
	t.prompt, t.logits = ids, true
	ctx, stopDrain := s.drainContext(q.r.Context())
	defer stopDrain()
	if !s.schedule(q, t, ctx) {
		return
	}
	for {
		t.mu.Lock()
		done := t.done
		t.mu.Unlock()
		if done {
			break
		}
		select {
		case <-t.notify:
		case <-ctx.Done():
			// The engine finishes the forward pass anyway; the slot frees itself then.
			q.failContext(ctx)
			return
		}
	}
	if t.fail != nil {
		q.fail(&APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "worker_crashed", Message: t.fail.Error()})
		return
	}
	if t.res.Reason == wire.ReasonError {
		q.fail(&APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "engine_error", Message: "logits failed: " + t.res.Message})
		return
	}
	b := make([]byte, 0, 160+base64.StdEncoding.EncodedLen(len(t.logitV)))
	b = append(b, `{"object":"logits","model":`...)
	b = appendJSONString(b, s.cfg.ModelName)
	b = append(b, `,"vocab_size":`...)
	b = strconv.AppendInt(b, int64(t.vocab), 10)
	b = append(b, `,"positions":`...)
	b = strconv.AppendInt(b, int64(len(ids)), 10)
	b = append(b, `,"dtype":"float32","encoding":"base64","data":"`...)
	b = base64.StdEncoding.AppendEncode(b, t.logitV)
	b = append(b, `"}`...)
	q.rec.FinishReason = "length"
	q.status = http.StatusOK
	q.w.Header().Set("Content-Type", "application/json")
	q.w.WriteHeader(http.StatusOK)
	_, _ = q.w.Write(b)
}
