package spec

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
)

// ChatUsageInput is the input of ChatPromptTokens and CheckChatUsage.
type ChatUsageInput struct {
	// API reaches the served model.
	API *API
	// Goldens are transformers' apply_chat_template renderings and their ids (system
	// messages, multi-turn, add_generation_prompt true and false).
	Goldens []ChatGolden
	// RecordsPath is the server's records file; when set, each request's record must count
	// the same input tokens. Empty for a server whose records the harness cannot read.
	RecordsPath string
}

// CheckChatUsage is ChatPromptTokens' core: for every golden conversation, POST
// /v1/chat/completions (what a client sends, not /tokenize) must count exactly the golden's
// prompt ids in usage.prompt_tokens, streamed (with include_usage) and not, and the request's
// server record must say the same in input_tokens. A chat route that renders differently from
// /tokenize (a dropped generation prompt, a lost system message) changes the count.
func CheckChatUsage(ctx context.Context, in ChatUsageInput) error {
	const fn = "spec.CheckChatUsage"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ChatUsageInput.API is nil", fn)
	case len(in.Goldens) == 0:
		return fmt.Errorf("%s: ChatUsageInput.Goldens is empty; load them with LoadChatGoldens", fn)
	}
	var problems []string
	ids := map[string]int{}
	for i, g := range in.Goldens {
		name := describeChat(i, g)
		for _, stream := range []bool{false, true} {
			body := map[string]any{"messages": g.Messages, "add_generation_prompt": g.AddGenerationPrompt, "max_tokens": 1, "temperature": 0, "stream": stream}
			if g.EnableThinking != nil {
				body["chat_template_kwargs"] = map[string]any{"enable_thinking": *g.EnableThinking}
			}
			if stream {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			id := newRequestID("chat-usage")
			ans, err := in.API.CompleteID(ctx, "/v1/chat/completions", id, body)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%s (stream %v): %v", name, stream, err))
				continue
			case !ans.HasUsage:
				problems = append(problems, fmt.Sprintf("%s (stream %v): the answer has no usage", name, stream))
			case ans.PromptTokens != len(g.IDs):
				problems = append(problems, fmt.Sprintf("%s (stream %v): usage.prompt_tokens %d, transformers' apply_chat_template gives %d tokens (add_generation_prompt %v)",
					name, stream, ans.PromptTokens, len(g.IDs), g.AddGenerationPrompt))
			}
			ids[id] = len(g.IDs)
		}
	}
	if in.RecordsPath != "" && len(ids) > 0 {
		recs, err := waitRecords(ctx, in.RecordsPath, keys(ids))
		if err != nil {
			problems = append(problems, err.Error())
		}
		for id, want := range ids {
			for _, r := range recs[id] {
				if r.InputTokens != want {
					problems = append(problems, fmt.Sprintf("record %s: input_tokens %d, transformers gives %d", id, r.InputTokens, want))
				}
			}
		}
	}
	if len(problems) > 0 {
		return errors.New("chat usage gate: the chat route counts prompt tokens differently from transformers' apply_chat_template:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// ChatPromptTokens asserts that the chat route counts prompt tokens as transformers renders
// the conversation (CheckChatUsage).
func ChatPromptTokens(ctx context.Context, input func() ChatUsageInput) {
	ginkgo.It("counts chat prompt tokens (usage and records) as transformers' apply_chat_template renders them", Gate(GateParity), Task(TaskChat), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		gomega.Expect(CheckChatUsage(c, input())).To(gomega.Succeed())
	})
}
