package tokenizer

import (
	"errors"
	"fmt"
)

// EncodePadded returns what transformers returns for
//
//	tokenizer(text, padding="max_length", max_length=maxLength, truncation=True)
//
// the call diffusers' pipelines make for their text encoders (FLUX: CLIP at 77 tokens, T5 at
// max_sequence_length 512 for dev and 256 for schnell). ids are the text's ids with the
// special tokens the tokenizer adds (CLIP: <|startoftext|> … <|endoftext|>; T5: … </s>); when
// they would exceed maxLength the text's ids are cut (from the right unless
// tokenizer_config.json sets truncation_side "left") so that the special tokens still fit, and
// shorter sequences are filled with the pad token up to maxLength (on the right unless
// padding_side is "left"). mask is the attention mask: 1 for real tokens, 0 for padding.
//
// It fails when the tokenizer has no pad token (tokenizer_config.json's pad_token), when
// maxLength cannot hold the special tokens, or when the post-processor is not supported.
func (t *Tokenizer) EncodePadded(text string, maxLength int) (ids, mask []int32, err error) {
	if t.post.err != nil {
		return nil, nil, t.post.err
	}
	specials := len(t.post.apply(nil))
	if maxLength < specials {
		return nil, nil, fmt.Errorf("tokenizer: max_length %d cannot hold the %d special tokens this tokenizer adds; pass at least %d", maxLength, specials, specials)
	}
	c := &t.config
	if !c.PADToken.Set || c.PADToken.Content == "" {
		return nil, nil, errors.New("tokenizer: tokenizer_config.json has no pad_token, so padding to max_length is undefined; set pad_token as the checkpoint's pipeline does")
	}
	padID, ok := t.SpecialID(c.PADToken.Content)
	if !ok {
		return nil, nil, fmt.Errorf("tokenizer: pad_token %q is not a token of this tokenizer", c.PADToken.Content)
	}
	body := t.Encode(text)
	if keep := maxLength - specials; len(body) > keep {
		if c.TruncationSide == "left" {
			body = body[len(body)-keep:]
		} else {
			body = body[:keep]
		}
	}
	real := t.post.apply(body)
	ids = make([]int32, maxLength)
	mask = make([]int32, maxLength)
	off := 0
	if c.PaddingSide == "left" {
		off = maxLength - len(real)
	}
	for i := range ids {
		ids[i] = padID
	}
	copy(ids[off:], real)
	for i := range real {
		mask[off+i] = 1
	}
	return ids, mask, nil
}
