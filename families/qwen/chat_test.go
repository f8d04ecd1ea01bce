package qwen_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/qual/spec"
)

// Chat covers Qwen3's template with enable_thinking false and true: the transformers
// renderings (tokenizer_golden.json's qwen3_chat holds both) and the corpus conversations,
// which carry both settings, streamed.
var _ = Describe("qwen chat", suite.Labels(), spec.Task(spec.TaskChat), spec.Premerge(), func() {
	spec.ChatTemplateParity(context.Background(), func() spec.ChatTemplateInput { return suite.ChatTemplateInput("qwen3_chat") })
	spec.StreamingParity(context.Background(), func() spec.StreamingInput { return suite.StreamingInput(true) })
})
