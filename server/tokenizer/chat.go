package tokenizer

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// chatTemplate is a compiled tokenizer_config.json chat_template plus the variables
// transformers adds to every render (the special-tokens map).
type chatTemplate struct {
	tpl    *exec.Template
	env    *exec.Environment
	tokens map[string]any
}

const chatTemplateName = "/chat_template"

// chatEnvironment mirrors transformers' ImmutableSandboxedEnvironment for chat templates
// (utils/chat_template_utils.py _compile_jinja_template): trim_blocks and lstrip_blocks on,
// a tojson filter that is Python's json.dumps(ensure_ascii=False) rather than Jinja's
// HTML-safe one, the raise_exception / strftime_now globals, and the {% generation %} tag.
// gonja renders everything else Qwen3's template uses natively (namespace(), loop.index0,
// messages[::-1], str methods such as .startswith/.split/.lstrip, `is string`, `in`); the
// golden tests in this package hold it to transformers' output byte for byte.
func chatEnvironment() *exec.Environment {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{})
	filters.Update(builtins.Filters)
	if err := filters.Replace("tojson", filterPythonToJSON); err != nil {
		panic(err) // gonja always ships tojson; reaching here means the dependency changed
	}
	ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	ctx.Set("raise_exception", raiseException)
	ctx.Set("strftime_now", strftimeNow)
	controls := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{})
	controls.Update(builtins.ControlStructures)
	if err := controls.Register("generation", generationParser); err != nil {
		panic(err) // only if gonja itself gains a "generation" tag
	}
	return &exec.Environment{
		Context:           ctx,
		Filters:           filters,
		Tests:             builtins.Tests,
		ControlStructures: controls,
		Methods:           builtins.Methods,
	}
}

func chatConfig() *config.Config {
	c := gonja.DefaultConfig.Inherit()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	c.KeepTrailingNewline = false
	return c
}

func newChatTemplate(spec *chatTemplateSpec, cfg *tokenizerConfig) (*chatTemplate, error) {
	if spec.Default == "" {
		return nil, errors.New("tokenizer_config.json: chat_template is empty (or has no \"default\" entry)")
	}
	env := chatEnvironment()
	loader, err := loaders.NewMemoryLoader(map[string]string{chatTemplateName: spec.Default})
	if err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	tpl, err := exec.NewTemplate(chatTemplateName, chatConfig(), loader, env)
	if err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: chat_template does not parse%s: %s", parseErrorLine(spec.Default, env), templateError(err, spec.Default))
	}
	tokens := map[string]any{}
	for name, f := range map[string]specialTokenField{
		"bos_token": cfg.BOSToken, "eos_token": cfg.EOSToken, "unk_token": cfg.UNKToken, "pad_token": cfg.PADToken,
		"sep_token": cfg.SEPToken, "cls_token": cfg.CLSToken, "mask_token": cfg.MaskToken,
	} {
		if f.Set && f.Content != "" { // special_tokens_map keeps only truthy values
			tokens[name] = f.Content
		}
	}
	if len(cfg.AdditionalSpecialTokens) > 0 {
		extra := make([]any, len(cfg.AdditionalSpecialTokens))
		for i, f := range cfg.AdditionalSpecialTokens {
			extra[i] = f.Content
		}
		tokens["additional_special_tokens"] = extra
	}
	return &chatTemplate{tpl: tpl, env: env, tokens: tokens}, nil
}

// render follows transformers' apply_chat_template(tokenize=False): the template sees
// messages, tools (None unless given), documents (None), add_generation_prompt, the special
// tokens of tokenizer_config.json, and the caller's kwargs, which win over all of those.
func (c *chatTemplate) render(msgs []Message, addGenerationPrompt bool, kwargs map[string]any) (string, error) {
	var scope renderScope
	defer scope.release()
	vars := maps.Clone(c.tokens)
	m, err := toTemplateValue(msgs, &scope)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat template input: %w", err)
	}
	vars["messages"] = m
	vars["tools"] = nil
	vars["documents"] = nil
	vars["add_generation_prompt"] = addGenerationPrompt
	for k, v := range kwargs {
		if vars[k], err = toTemplateValue(v, &scope); err != nil {
			return "", fmt.Errorf("tokenizer: chat template kwarg %s: %w", k, err)
		}
	}
	out, err := c.tpl.ExecuteToString(exec.NewContext(vars))
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %s", templateError(err, ""))
	}
	return out, nil
}

// templateError shortens gonja's errors, which quote the whole template source.
func templateError(err error, source string) string {
	msg := err.Error()
	if source != "" {
		msg = strings.ReplaceAll(msg, source, "<chat_template>")
	}
	return msg
}

// parseErrorLine re-parses a template that failed to parse to report the line where the
// parser stopped (gonja's parse errors do not carry it; render errors do).
func parseErrorLine(src string, env *exec.Environment) string {
	p := parser.NewParser(chatTemplateName, tokens.LexAll(src, chatConfig()), chatConfig(), nil, env.ControlStructures)
	if _, err := p.Parse(); err == nil {
		return ""
	}
	if tok := p.Stream().Current(); tok != nil {
		return fmt.Sprintf(" at line %d", tok.Line)
	}
	return ""
}

// raiseException is transformers' raise_exception(message) global: templates call it to
// refuse a conversation they cannot render (e.g. an unknown role).
func raiseException(msg string) (string, error) {
	return "", fmt.Errorf("chat template raised an exception: %s", msg)
}

// strftimeNow is transformers' strftime_now(format) global (Llama 3 templates date their
// system prompt with it). Only the common directives are translated.
func strftimeNow(format string) string {
	r := strings.NewReplacer("%d", "02", "%m", "01", "%Y", "2006", "%y", "06", "%B", "January", "%b", "Jan",
		"%H", "15", "%M", "04", "%S", "05", "%A", "Monday", "%a", "Mon", "%%", "%")
	return time.Now().Format(r.Replace(format))
}
