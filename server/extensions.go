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
// template ("rendered" is our extension, so a harness can compare templates directly). On a
// vision bundle the messages may hold the one image: the tokens are then the prompt the engine
// runs, placeholder expanded, with image_tokens and image_grid_thw beside them.
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
	var ids []int32 // set by the messages case (chatPromptOf also fills the record)
	switch {
	case m["prompt"] != nil && m["messages"] != nil:
		aerr = badRequest("messages", "send either `prompt` or `messages`, not both")
	case m["prompt"] != nil:
		text, aerr = str(m["prompt"], "prompt")
	case m["messages"] != nil:
		var cp *chatPrompt
		if cp, aerr = s.chatPromptOf(q, m); aerr != nil {
			break
		}
		resp["rendered"], text, ids = cp.rendered, cp.rendered, cp.ids
		if cp.image != nil {
			// The ids the model sees: the image placeholder expanded to one token per image
			// token, as transformers' processor returns input_ids.
			resp["image_tokens"] = q.rec.Vision.ImageTokens
			resp["image_grid_thw"] = cp.image.Grid
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
	if ids == nil {
		ids = s.tok.Encode(text)
		q.rec.PromptSHA256, q.rec.PromptBytes, q.rec.InputTokens = sha256Hex([]byte(text)), int64(len(text)), len(ids)
	}
	if ids == nil {
		ids = []int32{}
	}
	resp["tokens"], resp["count"] = ids, len(ids)
	q.writeJSON(http.StatusOK, resp)
}

// chatPrompt is a chat request's prompt as the engine takes it.
type chatPrompt struct {
	rendered string
	ids      []int32          // placeholder expanded when there is an image
	image    *wire.ImageInput // nil without an image
}

// chatPromptOf renders m's messages (with add_generation_prompt and chat_template_kwargs) and,
// when they hold images, decodes and processes it as the chat route does (prepareImage:
// same refusals, same record fields), so /tokenize and /mq/v1/logits see what
// /v1/chat/completions would run.
func (s *Server) chatPromptOf(q *reqState, m map[string]json.RawMessage) (*chatPrompt, *APIError) {
	msgs, img, aerr := decodeMessages(m["messages"], ChatLimits{MaxMessages: s.cfg.MaxMessages, MaxContentBytes: s.cfg.MaxChatBytes, MaxImages: s.cfg.MaxImages})
	if aerr != nil {
		return nil, aerr
	}
	addGen := true
	if raw, ok := m["add_generation_prompt"]; ok {
		if addGen, aerr = boolean(raw, "add_generation_prompt"); aerr != nil {
			return nil, aerr
		}
	}
	var kwargs map[string]any
	if raw, ok := m["chat_template_kwargs"]; ok && !isNull(raw) {
		if json.Unmarshal(raw, &kwargs) != nil {
			return nil, badRequest("chat_template_kwargs", "`chat_template_kwargs` must be an object")
		}
	}
	text, aerr := s.render(msgs, addGen, kwargs)
	if aerr != nil {
		return nil, aerr
	}
	cp := &chatPrompt{rendered: text, ids: s.tok.Encode(text)}
	q.rec.PromptSHA256, q.rec.PromptBytes, q.rec.InputTokens = sha256Hex([]byte(text)), int64(len(text)), len(cp.ids)
	if len(img) == 0 {
		return cp, nil
	}
	if cp.ids, cp.image, aerr = s.prepareImage(q, &GenRequest{Images: img}, cp.ids); aerr != nil {
		return nil, aerr
	}
	return cp, nil
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
// harness's parity gates (over HTTP, as it qualifies any deployment). The prompt is either
// token ids or, like /tokenize, chat messages rendered by the server; on a vision bundle the
// messages may hold the one image, processed as the chat route does, so a gate can hold a
// vision-language model's logits to transformers' through the server, image included.
func (s *Server) handleLogits(q *reqState) {
	body, ok := q.readBody()
	if !ok {
		return
	}
	m, aerr := decodeObject(body, "model", "prompt_token_ids", "messages", "add_generation_prompt", "chat_template_kwargs")
	if aerr == nil {
		aerr = s.checkModel(m)
	}
	if aerr == nil && s.task == "image" {
		// A text-to-image model has no logits; say where its requests go rather than let the
		// engine fail with a 500.
		aerr = badRequest("model", "model %q is a text-to-image model: it has no logits; send POST /v1/images/generations (or /mq/v1/image_latents for its final latents)", s.cfg.ModelName)
	}
	var ids []int32
	var img *wire.ImageInput
	if aerr == nil {
		switch {
		case m["prompt_token_ids"] != nil && m["messages"] != nil:
			aerr = badRequest("messages", "send either `prompt_token_ids` or `messages`, not both")
		case m["messages"] != nil:
			var cp *chatPrompt
			if cp, aerr = s.chatPromptOf(q, m); aerr == nil {
				ids, img = cp.ids, cp.image
				if len(ids) > s.info.MaxContext {
					aerr = badRequest("messages", "the rendered prompt's %d tokens exceed this model's context of %d", len(ids), s.info.MaxContext)
					aerr.Code = "context_length_exceeded"
				}
			}
		case m["prompt_token_ids"] == nil:
			aerr = badRequest("prompt_token_ids", "`prompt_token_ids` (a non-empty list of token ids) or `messages` (a chat, with the one image on a vision model) is required")
		default:
			if ids, aerr = decodeIDList(m["prompt_token_ids"], "prompt_token_ids"); aerr == nil {
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
			if aerr == nil && s.vision != nil {
				// Ids alone cannot carry an image: placeholder tokens without pixels would run
				// the model on nothing.
				for _, t := range ids {
					if t == s.vision.imageToken {
						aerr = badRequest("prompt_token_ids", "`prompt_token_ids` holds the image token; send `messages` with the image as an image_url content part instead")
						break
					}
				}
			}
		}
	}
	if aerr != nil {
		q.fail(aerr)
		return
	}
	if img == nil {
		q.rec.PromptSHA256, q.rec.PromptBytes = sha256Hex(idsBytes(ids)), int64(4*len(ids))
	}
	q.rec.InputTokens = len(ids)
	t := s.pool.newTask()
	t.prompt, t.logits, t.vision = ids, true, img
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
	q.writeBody(http.StatusOK, b)
}
