package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Text-to-image frames. A parent that predates them never sends them; a worker that predates
// them skips them (both sides skip types they do not know).
const (
	TypeImage       uint8 = 11 // parent → worker: u64 id, then an ImageRequest as JSON
	TypeImageResult uint8 = 12 // worker → parent: u64 id, u32 n, n bytes of ImageAnswer JSON, then the PNG
)

// ImageRequest is one text-to-image generation, as the frontend validated it.
type ImageRequest struct {
	Prompt   []int32 `json:"prompt"`
	Negative []int32 `json:"negative"`
	Width    int     `json:"width"`
	Height   int     `json:"height"`
	Steps    int     `json:"steps"`
	Guidance float32 `json:"guidance"`
	Seed     uint64  `json:"seed"`
	// Prompt2 and Negative2 are a second text encoder's ids (FLUX.1's T5); TrueCFG its
	// true_cfg_scale.
	Prompt2   []int32 `json:"prompt_2,omitempty"`
	Negative2 []int32 `json:"negative_2,omitempty"`
	TrueCFG   float32 `json:"true_cfg_scale,omitempty"`
	// Latents asks for the final latents too (the /mq/v1/image_latents introspection route).
	Latents bool `json:"latents,omitempty"`
}

// ImageAnswer is the worker's account of one generation; PNG follows it in the frame.
type ImageAnswer struct {
	ID         uint64 `json:"-"`
	Err        string `json:"err,omitempty"`
	PipelineNs int64  `json:"pipeline_ns"` // the native pipeline call alone
	EncodeNs   int64  `json:"encode_ns"`   // PNG encoding
	// Latents are the final latents (before the VAE), when the request asked for them;
	// LatentShape is their [channels, height, width].
	Latents     []float32 `json:"latents,omitempty"`
	LatentShape []int     `json:"latent_shape,omitempty"`
	PNG         []byte    `json:"-"` // aliases the frame payload: valid until the Reader's next call
}

// Image buffers an Image request.
func (w *Writer) Image(id uint64, r ImageRequest) error {
	j, err := json.Marshal(r)
	if err != nil {
		return err
	}
	s := w.begin(TypeImage)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, id)
	w.buf = append(w.buf, j...)
	w.end(s)
	return nil
}

// DecodeImage parses an Image request payload.
func DecodeImage(p []byte) (uint64, ImageRequest, error) {
	var r ImageRequest
	if len(p) < 8 {
		return 0, r, ErrShort
	}
	if err := json.Unmarshal(p[8:], &r); err != nil {
		return 0, r, fmt.Errorf("wire: image request: %v", err)
	}
	return binary.LittleEndian.Uint64(p), r, nil
}

// ImageResult buffers the answer to an Image request.
func (w *Writer) ImageResult(a ImageAnswer) {
	j, _ := json.Marshal(a) // plain fields: cannot fail
	s := w.begin(TypeImageResult)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, a.ID)
	w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(len(j)))
	w.buf = append(w.buf, j...)
	w.buf = append(w.buf, a.PNG...)
	w.end(s)
}

// DecodeImageResult parses an ImageResult payload.
func DecodeImageResult(p []byte) (ImageAnswer, error) {
	var a ImageAnswer
	if len(p) < 12 {
		return a, ErrShort
	}
	a.ID = binary.LittleEndian.Uint64(p)
	n := int(binary.LittleEndian.Uint32(p[8:]))
	if len(p)-12 < n {
		return a, ErrShort
	}
	if err := json.Unmarshal(p[12:12+n], &a); err != nil {
		return a, fmt.Errorf("wire: image result: %v", err)
	}
	a.PNG = p[12+n:]
	return a, nil
}
