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

// ImageInput is the processor's output for one image, as the engine takes it.
type ImageInput struct {
	Grid   [3]uint32
	Pixels []float32
}

// SubmitImage buffers a SubmitImage frame.
func (w *Writer) SubmitImage(id uint64, s Sampling, prompt []int32, im *ImageInput) {
	st := w.begin(TypeSubmitImage)
	b := appendSubmit(w.buf, id, s, prompt)
	for _, g := range im.Grid {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(im.Pixels)))
	for _, v := range im.Pixels {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	w.buf = b
	w.end(st)
}

// DecodeSubmitImage parses a SubmitImage payload; the prompt is appended to ids.
func DecodeSubmitImage(p []byte, ids []int32) (uint64, Sampling, []int32, *ImageInput, error) {
	id, s, ids, err := DecodeSubmit(p, ids)
	if err != nil {
		return id, s, ids, nil, err
	}
	const fixed = submitFixed
	rest := p[fixed+4+4*int(binary.LittleEndian.Uint32(p[fixed:])):]
	if len(rest) < 16 {
		return id, s, ids, nil, ErrShort
	}
	im := &ImageInput{}
	for i := range im.Grid {
		im.Grid[i] = binary.LittleEndian.Uint32(rest[4*i:])
	}
	n := int(binary.LittleEndian.Uint32(rest[12:]))
	rest = rest[16:]
	if n < 0 || len(rest) != 4*n {
		return id, s, ids, nil, fmt.Errorf("wire: SubmitImage holds %d bytes for %d pixel values", len(rest), n)
	}
	im.Pixels = make([]float32, n)
	for i := range im.Pixels {
		im.Pixels[i] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*i:]))
	}
	return id, s, ids, im, nil
}
