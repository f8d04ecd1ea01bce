package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

// spGolden is fixtures/golden/sp_tokenizer_golden.json, written by
// fixtures/golden/make_sp_tokenizer_golden.py with tokenizers and transformers (see
// fixtures/PROVENANCE.md). Fields without "auto_" come from the tokenizers library alone
// (tokenizer.json as written); "auto_" fields from transformers' AutoTokenizer on the saved
// folder (tokenizer_config.json's class and flags applied).
type spGolden struct {
	TokenizersVersion   string                       `json:"tokenizers_version"`
	TransformersVersion string                       `json:"transformers_version"`
	Tokenizers          map[string]spGoldenTokenizer `json:"tokenizers"`
	AddEOS              []struct {
		Text           string  `json:"text"`
		AutoIDsSpecial []int32 `json:"auto_ids_special"`
	} `json:"sp_bpe_llama_add_eos"`
}

type spGoldenTokenizer struct {
	AutoClass string           `json:"auto_class"`
	VocabSize int              `json:"vocab_size"`
	Strings   []spGoldenString `json:"strings"`
	Chat      []goldenChat     `json:"chat"`
}

type spGoldenString struct {
	Text            string   `json:"text"`
	IDs             []int32  `json:"ids"`
	IDsSpecial      []int32  `json:"ids_special"`
	Decoded         string   `json:"decoded"`
	DecodedSkip     string   `json:"decoded_skip"`
	DecodedPlain    string   `json:"decoded_plain"`
	AttentionMask   []int32  `json:"attention_mask"`
	AutoIDs         *[]int32 `json:"auto_ids"`
	AutoIDsSpecial  []int32  `json:"auto_ids_special"`
	AutoDecoded     *string  `json:"auto_decoded"`
	AutoDecodedSkip *string  `json:"auto_decoded_skip"`
}

func loadSPGolden(t *testing.T) *spGolden {
	t.Helper()
	var g spGolden
	readOptionalGolden(t, "sp_tokenizer_golden.json", "run fixtures/golden/make_sp_tokenizer_golden.py where tokenizers and transformers are installed (fixtures/PROVENANCE.md)", &g)
	if len(g.Tokenizers) == 0 {
		t.Fatal("sp_tokenizer_golden.json holds no tokenizers")
	}
	return &g
}

// TestSentencePieceGolden holds every SentencePiece-style and Unigram tokenizer the golden
// script made to the references: tokenizer.json alone against the tokenizers library, and
// with tokenizer_config.json against transformers' AutoTokenizer; ids and decoded text
// exactly, and the streaming decoder against Decode, never emitting invalid UTF-8.
func TestSentencePieceGolden(t *testing.T) {
	g := loadSPGolden(t)
	root := repoRoot(t)
	names := make([]string, 0, len(g.Tokenizers))
	for n := range g.Tokenizers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		rec := g.Tokenizers[name]
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(root, "fixtures", "tokenizers", name)
			raw := rawTokenizerJSON(t, dir)
			if raw.VocabSize() != rec.VocabSize {
				t.Errorf("VocabSize %d, want %d", raw.VocabSize(), rec.VocabSize)
			}
			auto, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range rec.Strings {
				checkRawGolden(t, raw, e)
				checkAutoGolden(t, auto, e)
			}
			for i, c := range rec.Chat {
				got, err := auto.ApplyChatTemplate(c.Messages, c.AddGenerationPrompt, nil)
				if err != nil {
					t.Errorf("chat[%d]: %v", i, err)
					continue
				}
				if got != c.Rendered {
					t.Errorf("chat[%d] rendering\n got %q\nwant %q", i, got, c.Rendered)
				}
				if ids := auto.Encode(got); !slices.Equal(ids, c.IDs) {
					t.Errorf("chat[%d] ids\n got %v\nwant %v", i, ids, c.IDs)
				}
			}
		})
	}
	if len(g.AddEOS) > 0 {
		dir := filepath.Join(root, "fixtures", "tokenizers", "sp-bpe-llama")
		tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
		if err != nil {
			t.Fatal(err)
		}
		cj, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(cj, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["add_eos_token"] = true
		cj, _ = json.Marshal(cfg)
		tok, err := FromBytes(tj, cj)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range g.AddEOS {
			if got, err := tok.EncodeWithSpecialTokens(e.Text); err != nil || !slices.Equal(got, e.AutoIDsSpecial) {
				t.Errorf("add_eos_token: EncodeWithSpecialTokens(%q) = %v, %v; want %v", e.Text, got, err, e.AutoIDsSpecial)
			}
		}
	}
}

func checkRawGolden(t *testing.T, tok *Tokenizer, e spGoldenString) {
	t.Helper()
	if tok.padding != nil || tok.truncation != nil {
		ids, _, err := tok.EncodeDeclared(e.Text, false)
		if err != nil || !slices.Equal(ids, e.IDs) {
			t.Errorf("EncodeDeclared(%q, false) = %v, %v\nwant %v", e.Text, ids, err, e.IDs)
		}
		ids, mask, err := tok.EncodeDeclared(e.Text, true)
		if err != nil || !slices.Equal(ids, e.IDsSpecial) {
			t.Errorf("EncodeDeclared(%q, true) = %v, %v\nwant %v", e.Text, ids, err, e.IDsSpecial)
		}
		if e.AttentionMask != nil && !slices.Equal(mask, e.AttentionMask) {
			t.Errorf("EncodeDeclared(%q) mask = %v, want %v", e.Text, mask, e.AttentionMask)
		}
	} else {
		if got := tok.Encode(e.Text); !slices.Equal(got, e.IDs) {
			t.Errorf("Encode(%q)\n got %v %q\nwant %v", e.Text, got, pieces(tok, got), e.IDs)
		}
		if got, err := tok.EncodeWithSpecialTokens(e.Text); err != nil || !slices.Equal(got, e.IDsSpecial) {
			t.Errorf("EncodeWithSpecialTokens(%q) = %v, %v\nwant %v", e.Text, got, err, e.IDsSpecial)
		}
	}
	if got := tok.Decode(e.IDsSpecial); got != e.Decoded {
		t.Errorf("Decode(%v) = %q, want %q", e.IDsSpecial, got, e.Decoded)
	}
	if got := tok.DecodeSkipSpecial(e.IDsSpecial); got != e.DecodedSkip {
		t.Errorf("DecodeSkipSpecial(%v) = %q, want %q", e.IDsSpecial, got, e.DecodedSkip)
	}
	if got := tok.Decode(e.IDs); got != e.DecodedPlain {
		t.Errorf("Decode(%v) = %q, want %q", e.IDs, got, e.DecodedPlain)
	}
	if got := streamChecked(t, tok, e.IDsSpecial, false); got != e.Decoded {
		t.Errorf("stream of %v = %q, want %q", e.IDsSpecial, got, e.Decoded)
	}
	if got := streamChecked(t, tok, e.IDsSpecial, true); got != e.DecodedSkip {
		t.Errorf("skip-special stream of %v = %q, want %q", e.IDsSpecial, got, e.DecodedSkip)
	}
}

func checkAutoGolden(t *testing.T, tok *Tokenizer, e spGoldenString) {
	t.Helper()
	if e.AutoIDs == nil {
		return
	}
	if got := tok.Encode(e.Text); !slices.Equal(got, *e.AutoIDs) {
		t.Errorf("with tokenizer_config.json: Encode(%q)\n got %v %q\nwant %v (AutoTokenizer)", e.Text, got, pieces(tok, got), *e.AutoIDs)
	}
	if got, err := tok.EncodeWithSpecialTokens(e.Text); err != nil || !slices.Equal(got, e.AutoIDsSpecial) {
		t.Errorf("with tokenizer_config.json: EncodeWithSpecialTokens(%q) = %v, %v\nwant %v (AutoTokenizer)", e.Text, got, err, e.AutoIDsSpecial)
	}
	if e.AutoDecoded != nil {
		if got := tok.Decode(e.IDsSpecial); got != *e.AutoDecoded {
			t.Errorf("with tokenizer_config.json: Decode(%v) = %q, want %q (AutoTokenizer)", e.IDsSpecial, got, *e.AutoDecoded)
		}
		if got := streamChecked(t, tok, e.IDsSpecial, false); got != *e.AutoDecoded {
			t.Errorf("with tokenizer_config.json: stream of %v = %q, want %q", e.IDsSpecial, got, *e.AutoDecoded)
		}
	}
	if e.AutoDecodedSkip != nil {
		if got := tok.DecodeSkipSpecial(e.IDsSpecial); got != *e.AutoDecodedSkip {
			t.Errorf("with tokenizer_config.json: DecodeSkipSpecial(%v) = %q, want %q (AutoTokenizer)", e.IDsSpecial, got, *e.AutoDecodedSkip)
		}
	}
}
