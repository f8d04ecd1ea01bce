package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
)

// postProcessor is what encode(text, add_special_tokens=True) adds around the ids of one
// sequence: tokenizers' TemplateProcessing "single" template (or the fixed templates of
// RobertaProcessing and BertProcessing), in order.
type postProcessor struct {
	steps [][]templatePiece
	// err is set for a post-processor this package does not implement; encoding with special
	// tokens then fails with it, while encoding without them works.
	err error
}

// templatePiece is one element of a template: the sequence itself, or special-token ids.
type templatePiece struct {
	sequence bool
	ids      []int32
}

type postProcessorJSON struct {
	Type          string            `json:"type"`
	Single        []json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Processors []json.RawMessage   `json:"processors"`
	Sep        *[2]json.RawMessage `json:"sep"`
	Cls        *[2]json.RawMessage `json:"cls"`
}

func parsePostProcessor(raw []byte, t *Tokenizer) (*postProcessor, error) {
	p := &postProcessor{}
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	if err := p.add(raw, "post_processor"); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *postProcessor) add(raw []byte, where string) error {
	var j postProcessorJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("tokenizer.json: %s: %w", where, err)
	}
	switch j.Type {
	case "ByteLevel":
		// Only trims offsets; adds no ids.
	case "Sequence":
		for i, r := range j.Processors {
			if err := p.add(r, fmt.Sprintf("%s.processors[%d]", where, i)); err != nil {
				return err
			}
		}
	case "TemplateProcessing":
		var tmpl []templatePiece
		for i, r := range j.Single {
			var piece struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(r, &piece); err != nil {
				return fmt.Errorf("tokenizer.json: %s.single[%d]: %w", where, i, err)
			}
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" {
					return fmt.Errorf("tokenizer.json: %s.single[%d]: the single template refers to sequence %q; it can only hold $A", where, i, piece.Sequence.ID)
				}
				tmpl = append(tmpl, templatePiece{sequence: true})
			case piece.SpecialToken != nil:
				st, ok := j.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("tokenizer.json: %s.single[%d]: special token %q is missing from %s.special_tokens", where, i, piece.SpecialToken.ID, where)
				}
				tmpl = append(tmpl, templatePiece{ids: st.IDs})
			default:
				return fmt.Errorf("tokenizer.json: %s.single[%d]: want {\"SpecialToken\": ...} or {\"Sequence\": ...}", where, i)
			}
		}
		p.steps = append(p.steps, tmpl)
	case "RobertaProcessing", "BertProcessing":
		if j.Cls == nil || j.Sep == nil {
			return fmt.Errorf("tokenizer.json: %s: %s needs \"cls\" and \"sep\" as [token, id]", where, j.Type)
		}
		var cls, sep int32
		if err := json.Unmarshal(j.Cls[1], &cls); err != nil {
			return fmt.Errorf("tokenizer.json: %s.cls: %w", where, err)
		}
		if err := json.Unmarshal(j.Sep[1], &sep); err != nil {
			return fmt.Errorf("tokenizer.json: %s.sep: %w", where, err)
		}
		p.steps = append(p.steps, []templatePiece{{ids: []int32{cls}}, {sequence: true}, {ids: []int32{sep}}})
	default:
		p.err = fmt.Errorf("tokenizer: post_processor type %q is not supported; encode without special tokens, or use a tokenizer whose post_processor is TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel or a Sequence of them", j.Type)
	}
	return nil
}

// apply wraps ids with the template(s).
func (p *postProcessor) apply(ids []int32) []int32 {
	for _, tmpl := range p.steps {
		out := make([]int32, 0, len(ids)+4)
		for _, piece := range tmpl {
			if piece.sequence {
				out = append(out, ids...)
			} else {
				out = append(out, piece.ids...)
			}
		}
		ids = out
	}
	return ids
}

// configPostProcessor is transformers' update_post_processor: when tokenizer_config.json sets
// add_bos_token or add_eos_token, the template becomes [bos] $A [eos] with the config's
// bos_token and eos_token (a flag whose token is unset adds nothing).
func (t *Tokenizer) configPostProcessor() (*postProcessor, error) {
	c := &t.config
	if c.AddBOSToken == nil && c.AddEOSToken == nil {
		return nil, nil
	}
	var tmpl []templatePiece
	tokenID := func(f specialTokenField, name string) ([]int32, error) {
		id, ok := t.SpecialID(f.Content)
		if !ok {
			return nil, fmt.Errorf("tokenizer_config.json: %s %q is not a token of tokenizer.json; add_%s needs it", name, f.Content, name)
		}
		return []int32{id}, nil
	}
	if c.AddBOSToken != nil && *c.AddBOSToken && c.BOSToken.Set {
		ids, err := tokenID(c.BOSToken, "bos_token")
		if err != nil {
			return nil, err
		}
		tmpl = append(tmpl, templatePiece{ids: ids})
	}
	tmpl = append(tmpl, templatePiece{sequence: true})
	if c.AddEOSToken != nil && *c.AddEOSToken && c.EOSToken.Set {
		ids, err := tokenID(c.EOSToken, "eos_token")
		if err != nil {
			return nil, err
		}
		tmpl = append(tmpl, templatePiece{ids: ids})
	}
	return &postProcessor{steps: [][]templatePiece{tmpl}}, nil
}

// EncodeWithSpecialTokens returns the ids of transformers' tokenizer.encode(text)
// (add_special_tokens=True, no padding, no truncation): Encode's ids with the BOS/EOS the
// post-processor adds (tokenizer.json's, or the one transformers builds from add_bos_token /
// add_eos_token in tokenizer_config.json). transformers turns off the padding and truncation a
// tokenizer.json declares unless the call asks for them; EncodeDeclared applies them.
func (t *Tokenizer) EncodeWithSpecialTokens(text string) ([]int32, error) {
	if t.post.err != nil {
		return nil, t.post.err
	}
	return t.post.apply(t.Encode(text)), nil
}

// EncodeDeclared is the tokenizers library's Tokenizer.encode(text, add_special_tokens): the
// truncation and padding tokenizer.json declares are applied (truncation keeps room for the
// special tokens), and mask is the attention mask (1 for real tokens, 0 for padding).
func (t *Tokenizer) EncodeDeclared(text string, addSpecialTokens bool) (ids, mask []int32, err error) {
	ids = t.Encode(text)
	added := 0
	if addSpecialTokens {
		if t.post.err != nil {
			return nil, nil, t.post.err
		}
		added = len(t.post.apply(nil))
	}
	if tr := t.truncation; tr != nil && len(ids)+added > tr.maxLength {
		keep := max(tr.maxLength-added, 0)
		if tr.left {
			ids = ids[len(ids)-keep:]
		} else {
			ids = ids[:keep]
		}
	}
	if addSpecialTokens {
		ids = t.post.apply(ids)
	}
	real := len(ids)
	if pd := t.padding; pd != nil {
		ids = pd.pad(ids)
	}
	mask = make([]int32, len(ids))
	for i := range mask {
		mask[i] = 1
	}
	if pd := t.padding; pd != nil && len(ids) > real {
		pads := len(ids) - real
		if pd.left {
			clear(mask[:pads])
		} else {
			clear(mask[real:])
		}
	}
	return ids, mask, nil
}

// truncation is tokenizer.json's "truncation" for a single sequence.
type truncation struct {
	maxLength int
	left      bool
}

func parseTruncation(raw []byte) (*truncation, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var j struct {
		MaxLength *int   `json:"max_length"`
		Direction string `json:"direction"`
		Stride    int    `json:"stride"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("tokenizer.json: truncation: %w", err)
	}
	if j.MaxLength == nil || *j.MaxLength < 0 {
		return nil, errors.New("tokenizer.json: truncation needs a non-negative max_length")
	}
	if j.Direction != "" && j.Direction != "Right" && j.Direction != "Left" {
		return nil, fmt.Errorf("tokenizer.json: truncation.direction %q: want Right or Left", j.Direction)
	}
	return &truncation{maxLength: *j.MaxLength, left: j.Direction == "Left"}, nil
}

// padding is tokenizer.json's "padding". Only a fixed length pads a single sequence
// (BatchLongest pads a batch to its longest member, which for one sequence is itself).
type padding struct {
	length   int // 0: BatchLongest
	multiple int
	padID    int32
	left     bool
}

// maxPadLength bounds declared padding lengths: far above any model's context, low enough
// that a corrupt file cannot make every encode allocate gigabytes.
const maxPadLength = 1 << 20

func parsePadding(raw []byte) (*padding, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var j struct {
		Strategy        json.RawMessage `json:"strategy"`
		Direction       string          `json:"direction"`
		PadToMultipleOf *int            `json:"pad_to_multiple_of"`
		PadID           int32           `json:"pad_id"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("tokenizer.json: padding: %w", err)
	}
	p := &padding{padID: j.PadID, left: j.Direction == "Left"}
	if j.PadToMultipleOf != nil {
		if *j.PadToMultipleOf < 0 || *j.PadToMultipleOf > maxPadLength {
			return nil, fmt.Errorf("tokenizer.json: padding.pad_to_multiple_of %d is outside 0..%d", *j.PadToMultipleOf, maxPadLength)
		}
		p.multiple = *j.PadToMultipleOf
	}
	var fixed struct {
		Fixed *int `json:"Fixed"`
	}
	var name string
	switch {
	case json.Unmarshal(j.Strategy, &name) == nil && name == "BatchLongest":
	case json.Unmarshal(j.Strategy, &fixed) == nil && fixed.Fixed != nil && *fixed.Fixed >= 0 && *fixed.Fixed <= maxPadLength:
		p.length = *fixed.Fixed
	default:
		return nil, fmt.Errorf("tokenizer.json: padding.strategy %s: want \"BatchLongest\" or {\"Fixed\": n} with 0 <= n <= %d", truncateForError(j.Strategy), maxPadLength)
	}
	return p, nil
}

func (p *padding) pad(ids []int32) []int32 {
	target := max(p.length, len(ids))
	if p.multiple > 0 && target%p.multiple != 0 {
		target += p.multiple - target%p.multiple
	}
	if target <= len(ids) {
		return ids
	}
	pad := make([]int32, target-len(ids))
	for i := range pad {
		pad[i] = p.padID
	}
	if p.left {
		return append(pad, ids...)
	}
	return append(ids, pad...)
}
