package tokenizer

import (
	"encoding/json"
	"fmt"
)

// tokenizerConfig is the part of transformers' tokenizer_config.json that changes encode,
// decode or chat rendering. Everything else (model_max_length, tokenizer_class, ...) is left
// to the server's configuration.
type tokenizerConfig struct {
	ChatTemplate              *chatTemplateSpec `json:"chat_template"`
	CleanUpTokenizationSpaces *bool             `json:"clean_up_tokenization_spaces"`
	// CleanUpBPEAnyway makes decode clean up a BPE model's text too (transformers 5 skips it).
	CleanUpBPEAnyway        bool                `json:"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"`
	BOSToken                specialTokenField   `json:"bos_token"`
	EOSToken                specialTokenField   `json:"eos_token"`
	UNKToken                specialTokenField   `json:"unk_token"`
	PADToken                specialTokenField   `json:"pad_token"`
	SEPToken                specialTokenField   `json:"sep_token"`
	CLSToken                specialTokenField   `json:"cls_token"`
	MaskToken               specialTokenField   `json:"mask_token"`
	AdditionalSpecialTokens []specialTokenField `json:"additional_special_tokens"`
	// AddBOSToken and AddEOSToken, when either is present, make transformers rebuild the
	// post-processor as [bos] $A [eos] (TokenizersBackend.update_post_processor); classes
	// with their own post-processor rule (LlamaTokenizer, T5Tokenizer) ignore them.
	AddBOSToken *bool `json:"add_bos_token"`
	AddEOSToken *bool `json:"add_eos_token"`
	// TokenizerClass picks the transformers class, which for some SentencePiece tokenizers
	// rebuilds the pipeline around tokenizer.json's vocabulary (see tokenizerclass.go), with
	// AddPrefixSpace and Legacy as its options.
	TokenizerClass string `json:"tokenizer_class"`
	// PaddingSide and TruncationSide ("right" unless set to "left") steer EncodePadded, as
	// they steer transformers' padding="max_length", truncation=True.
	PaddingSide    string `json:"padding_side"`
	TruncationSide string `json:"truncation_side"`
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	Legacy         *bool  `json:"legacy"`
}

// specialTokenField accepts the three shapes transformers writes for a special token: null,
// a plain string, or an AddedToken object {"content": ..., "__type": "AddedToken"}.
type specialTokenField struct {
	Content string
	Set     bool
}

func (s *specialTokenField) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = specialTokenField{}
		return nil
	}
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = specialTokenField{Content: str, Set: true}
		return nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(b, &obj); err != nil || obj.Content == nil {
		return fmt.Errorf("special token %s is neither a string nor an object with \"content\"", truncateForError(b))
	}
	*s = specialTokenField{Content: *obj.Content, Set: true}
	return nil
}

// chatTemplateSpec accepts both shapes of chat_template: one template string, or a list of
// {"name", "template"} where "default" is the one apply_chat_template uses without a name.
type chatTemplateSpec struct {
	Default string
	Named   map[string]string
}

func (c *chatTemplateSpec) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		c.Default = str
		return nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("chat_template %s is neither a string nor a list of {name, template}", truncateForError(b))
	}
	c.Named = map[string]string{}
	for _, e := range list {
		c.Named[e.Name] = e.Template
	}
	c.Default = c.Named["default"]
	return nil
}

func truncateForError(b []byte) string {
	const max = 80
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}
