package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// TypeSubmitImage (parent → worker) is a Submit with one image for a vision-language engine:
// the Submit payload, then the image's grid (3 x uint32: temporal, height, width in patches)
// and its pixel values (uint32 count, then float32 LE). A worker without images answers it with
// an error Done.
const TypeSubmitImage uint8 = 13

// TypeLogitsImage (parent → worker) is a Logits request with one image: the Logits payload,
// then the image as in SubmitImage. The worker answers with a LogitsResult (an error one when
// its engine takes no images), so the logits route can hold a vision-language model's first
// step to transformers through the server, image included.
const TypeLogitsImage uint8 = 14

// ImageInput is the processor's output for one image, as the engine takes it.
type ImageInput struct {
	Grid   [3]uint32
	Pixels []float32
}

// SubmitImage buffers a SubmitImage frame.
func (w *Writer) SubmitImage(id uint64, s Sampling, prompt []int32, im *ImageInput) {
	st := w.begin(TypeSubmitImage)
	w.buf = appendImage(appendSubmit(w.buf, id, s, prompt), im)
	w.end(st)
}

// LogitsImage buffers a LogitsImage frame.
func (w *Writer) LogitsImage(id uint64, prompt []int32, im *ImageInput) {
	st := w.begin(TypeLogitsImage)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, id)
	w.buf = appendImage(appendIDs(w.buf, prompt), im)
	w.end(st)
}

// DecodeLogitsImage parses a LogitsImage payload; the prompt is appended to ids.
func DecodeLogitsImage(p []byte, ids []int32) (uint64, []int32, *ImageInput, error) {
	id, ids, err := DecodeLogits(p, ids)
	if err != nil {
		return id, ids, nil, err
	}
	im, err := decodeImage(p[8+4+4*int(binary.LittleEndian.Uint32(p[8:])):])
	return id, ids, im, err
}

// appendImage appends an image: its grid (3 x uint32), the pixel count (uint32) and the
// pixel values (float32 LE).
func appendImage(b []byte, im *ImageInput) []byte {
	for _, g := range im.Grid {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(im.Pixels)))
	for _, v := range im.Pixels {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// decodeImage parses what appendImage wrote; rest must hold exactly that.
func decodeImage(rest []byte) (*ImageInput, error) {
	if len(rest) < 16 {
		return nil, ErrShort
	}
	im := &ImageInput{}
	for i := range im.Grid {
		im.Grid[i] = binary.LittleEndian.Uint32(rest[4*i:])
	}
	n := int(binary.LittleEndian.Uint32(rest[12:]))
	rest = rest[16:]
	if n < 0 || len(rest) != 4*n {
		return nil, fmt.Errorf("wire: an image frame holds %d bytes for %d pixel values", len(rest), n)
	}
	im.Pixels = make([]float32, n)
	for i := range im.Pixels {
		im.Pixels[i] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*i:]))
	}
	return im, nil
}

// DecodeSubmitImage parses a SubmitImage payload; the prompt is appended to ids.
func DecodeSubmitImage(p []byte, ids []int32) (uint64, Sampling, []int32, *ImageInput, error) {
	id, s, ids, err := DecodeSubmit(p, ids)
	if err != nil {
		return id, s, ids, nil, err
	}
	const fixed = 8 + 4*4 + 8 + 1
	im, err := decodeImage(p[fixed+4+4*int(binary.LittleEndian.Uint32(p[fixed:])):])
	return id, s, ids, im, nil
}
