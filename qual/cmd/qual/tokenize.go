package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"unicode/utf8"

	"github.com/modelqual/modelqual/native/bundle"
	"github.com/modelqual/modelqual/server/tokenizer"
)

func init() {
	register("tokenize", "encode stdin (text, or a chat rendered with the checkpoint's template) to token ids", func(args []string) int {
		return tokenizeMain(args, os.Stdin, os.Stdout, os.Stderr)
	})
}

const tokenizeUsage = `Usage:
  qual tokenize (--tokenizer DIR | --bundle FILE) [--chat] < INPUT

Encodes stdin with a checkpoint's own tokenizer exactly as Hugging Face's
tokenizer.encode(text, add_special_tokens=False) does (special tokens written in the text are
recognized) and prints {"ids": [...]}. The text is taken byte for byte, so 'echo' adds a
trailing newline token; use 'printf' or 'echo -n' to avoid it.

With --chat, stdin is a JSON request
  {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true,
   "chat_template_kwargs": {"enable_thinking": false}, "tools": [...]}
rendered with the tokenizer_config.json chat_template as transformers' apply_chat_template
does, and the output is {"rendered": "...", "ids": [...]}.

--tokenizer DIR reads DIR/tokenizer.json and DIR/tokenizer_config.json (a checkpoint
snapshot or fixtures/tokenizers/<name>); --bundle FILE reads the same files from a bundle's
sections.

Flags:
`

// chatRequest is the --chat input: the chat fields of an OpenAI/vLLM tokenize request.
// Values stay raw JSON so the template sees objects in their written key order, as
// transformers does (see tokenizer.ApplyChatTemplate).
type chatRequest struct {
	Messages            []map[string]json.RawMessage `json:"messages"`
	AddGenerationPrompt bool                         `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]json.RawMessage   `json:"chat_template_kwargs"`
	Tools               json.RawMessage              `json:"tools"`
}

func tokenizeMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("qual tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("tokenizer", "", "directory holding tokenizer.json (and tokenizer_config.json)")
	bundlePath := fs.String("bundle", "", "bundle file whose tokenizer sections to use")
	chat := fs.Bool("chat", false, "stdin is a chat request (JSON); print the rendering and its ids")
	fs.Usage = func() {
		fmt.Fprint(stderr, tokenizeUsage)
		fs.PrintDefaults()
	}
	if err := parseAll(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "qual tokenize: unexpected arguments %q; the input comes on stdin\n", fs.Args())
		return 2
	}
	if (*dir == "") == (*bundlePath == "") {
		fmt.Fprintln(stderr, "qual tokenize: pass exactly one of --tokenizer DIR or --bundle FILE")
		return 2
	}
	tok, err := loadTokenizer(*dir, *bundlePath)
	if err != nil {
		fmt.Fprintf(stderr, "qual tokenize: %v\n", err)
		return 1
	}
	in, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "qual tokenize: read stdin: %v\n", err)
		return 1
	}
	var out any
	if *chat {
		var req chatRequest
		dec := json.NewDecoder(bytes.NewReader(in))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			fmt.Fprintf(stderr, "qual tokenize: --chat: stdin is not a chat request {\"messages\", \"add_generation_prompt\", \"chat_template_kwargs\", \"tools\"}: %v\n", err)
			return 1
		}
		if len(req.Messages) == 0 {
			fmt.Fprintln(stderr, "qual tokenize: --chat: the request has no messages")
			return 1
		}
		msgs := make([]tokenizer.Message, len(req.Messages))
		for i, m := range req.Messages {
			msgs[i] = rawToAny(m)
		}
		kwargs := rawToAny(req.ChatTemplateKwargs)
		if len(req.Tools) > 0 && string(req.Tools) != "null" {
			kwargs["tools"] = req.Tools
		}
		rendered, err := tok.ApplyChatTemplate(msgs, req.AddGenerationPrompt, kwargs)
		if err != nil {
			fmt.Fprintf(stderr, "qual tokenize: %v\n", err)
			return 1
		}
		out = struct {
			Rendered string  `json:"rendered"`
			IDs      []int32 `json:"ids"`
		}{rendered, nonNil(tok.Encode(rendered))}
	} else {
		if !utf8.Valid(in) {
			fmt.Fprintln(stderr, "qual tokenize: stdin is not valid UTF-8; the tokenizer encodes text, not bytes")
			return 1
		}
		out = struct {
			IDs []int32 `json:"ids"`
		}{nonNil(tok.Encode(string(in)))}
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false) // keep "<|im_start|>" readable
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "qual tokenize: write output: %v\n", err)
		return 1
	}
	return 0
}

func loadTokenizer(dir, bundlePath string) (*tokenizer.Tokenizer, error) {
	if dir != "" {
		return tokenizer.Load(dir)
	}
	b, err := bundle.Open(bundlePath)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	t, err := tokenizer.FromBundle(b)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", bundlePath, err)
	}
	return t, nil
}

func rawToAny(m map[string]json.RawMessage) map[string]any {
	out := make(map[string]any, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// nonNil makes an empty encoding print as [] rather than null.
func nonNil(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return slices.Clip(ids)
}
