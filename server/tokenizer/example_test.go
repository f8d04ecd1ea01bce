package tokenizer_test

import (
	"fmt"
	"github.com/modelqual/modelqual/fixtures"
	"path/filepath"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// fixtureDir finds fixtures/tokenizers/<name> from the package directory.
func fixtureDir(name string) string {
	root, _ := fixtures.RepoRoot()
	return filepath.Join(root, "fixtures", "tokenizers", name)
}

func Example() {
	tok, err := tokenizer.Load(fixtureDir("qwen3"))
	if err != nil {
		panic(err)
	}
	prompt, err := tok.ApplyChatTemplate([]tokenizer.Message{{"role": "user", "content": "hi"}}, true,
		map[string]any{"enable_thinking": false})
	if err != nil {
		panic(err)
	}
	ids := tok.Encode(prompt)
	fmt.Printf("%q\n%v\n", prompt, ids)

	// Stream a reply back one id at a time.
	d := tok.NewStreamDecoder()
	for _, id := range tok.Encode("Hi 🦩!") { // the flamingo's four bytes span two ids
		fmt.Printf("%q ", d.Add(id))
	}
	fmt.Printf("%q\n", d.Flush())
	// Output:
	// "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	// [151644 872 198 6023 151645 198 151644 77091 198 151667 271 151668 271]
	// "Hi" " " "" "🦩" "!" ""
}
