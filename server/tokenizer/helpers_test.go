package tokenizer

import (
	"encoding/json"
	"errors"
	"github.com/modelqual/modelqual/fixtures"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// repoRoot walks up from the test's working directory to the directory holding go.mod, so the
// tests find fixtures/ wherever `go test` runs them.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	root, err := fixtures.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

var (
	loadOnce sync.Once
	loaded   map[string]*Tokenizer
	loadErr  error
)

// fixtureTokenizer loads fixtures/tokenizers/<name> once per test binary: the Qwen3 file is
// 11 MB and many tests share it.
func fixtureTokenizer(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	root := repoRoot(tb)
	loadOnce.Do(func() {
		loaded = map[string]*Tokenizer{}
		for _, n := range []string{"gpt2", "qwen3"} {
			t, err := Load(filepath.Join(root, "fixtures", "tokenizers", n))
			if err != nil {
				loadErr = err
				return
			}
			loaded[n] = t
		}
	})
	if loadErr != nil {
		tb.Fatal(loadErr)
	}
	return loaded[name]
}

type goldenEncode struct {
	Text    string  `json:"text"`
	IDs     []int32 `json:"ids"`
	Decoded string  `json:"decoded"`
}

type goldenChat struct {
	Messages            []Message `json:"messages"`
	AddGenerationPrompt bool      `json:"add_generation_prompt"`
	EnableThinking      *bool     `json:"enable_thinking"`
	Rendered            string    `json:"rendered"`
	IDs                 []int32   `json:"ids"`
}

type golden struct {
	Generator string         `json:"generator"`
	GPT2      []goldenEncode `json:"gpt2"`
	Qwen3     []goldenEncode `json:"qwen3"`
	Qwen3Chat []goldenChat   `json:"qwen3_chat"`
}

func loadGolden(tb testing.TB) *golden {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(tb), "fixtures", "golden", "tokenizer_golden.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		tb.Fatal(err)
	}
	if len(g.GPT2) == 0 || len(g.Qwen3) == 0 || len(g.Qwen3Chat) == 0 {
		tb.Fatal("tokenizer_golden.json lacks gpt2, qwen3 or qwen3_chat entries")
	}
	return &g
}

// readOptionalGolden reads fixtures/golden/<name> into v. While a golden that only the GPU
// host can make is absent the test skips, saying how to make it (howTo); a file that is present
// but unreadable fails the test.
func readOptionalGolden(t *testing.T, name, howTo string, v any) {
	t.Helper()
	path := filepath.Join(repoRoot(t), "fixtures", "golden", name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s is not generated yet: %s", path, howTo)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// rawTokenizerJSON loads dir/tokenizer.json alone (no tokenizer_config.json): the pipeline the
// tokenizers library runs from the file as written.
func rawTokenizerJSON(t testing.TB, dir string) *Tokenizer {
	t.Helper()
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := FromBytes(tj, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
