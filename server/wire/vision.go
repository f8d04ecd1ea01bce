package wire

import (
	"encoding/binary"
	"fmt"
	"math"
)

// TypeSubmitImage (parent → worker) is a Submit with a vision-language prompt's images: the
// Submit payload, then the image's grid (3 x uint32: temporal, height, width in patches) and
// its pixel values (uint32 count, then float32 LE); for several images that keep their own grids
// (ImageInput.Grids), a trailer follows: the image count (uint32) and every image's grid (3 x
// uint32 each). A worker without images answers it with an error Done.
const TypeSubmitImage uint8 = 13

// TypeLogitsImage (parent → worker) is a Logits request with one image: the Logits payload,
// then the image as in SubmitImage. The worker answers with a LogitsResult (an error one when
// its engine takes no images), so the logits route can hold a vision-language model's first
// step to transformers through the server, image included.
const TypeLogitsImage uint8 = 14

// ImageInput is the processor's output for a prompt's images, as the engine takes it: one
// image, or several stacked into one grid (InternVL's tiles), in Grid and Pixels; or several
// that keep their own grids (Qwen3-VL), listed in Grids, their pixels one after another in
// Pixels, and Grid the first one's.
type ImageInput struct {
	Grid   [3]uint32
	Pixels []float32
	// Grids is every image's grid, in prompt order, when there are several unstacked images;
	// nil otherwise.
	Grids [][3]uint32
}

// Split returns each image's grid and pixel values: the one Grid and Pixels without Grids, else
// Pixels cut in proportion to each grid's patch count (every patch row has the same width).
func (im *ImageInput) Split() ([][3]uint32, [][]float32, error) {
	if len(im.Grids) == 0 {
		return [][3]uint32{im.Grid}, [][]float32{im.Pixels}, nil
	}
	patches := 0
	for _, g := range im.Grids {
		patches += int(g[0]) * int(g[1]) * int(g[2])
	}
	if patches == 0 || len(im.Pixels)%patches != 0 {
		return nil, nil, fmt.Errorf("wire: %d pixel values do not divide into the %d patches of %d grids", len(im.Pixels), patches, len(im.Grids))
	}
	row := len(im.Pixels) / patches
	out := make([][]float32, len(im.Grids))
	at := 0
	for k, g := range im.Grids {
		n := int(g[0]) * int(g[1]) * int(g[2]) * row
		out[k] = im.Pixels[at : at+n : at+n]
		at += n
	}
	return im.Grids, out, nil
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
// pixel values (float32 LE); then, with Grids, their count (uint32) and the grids.
func appendImage(b []byte, im *ImageInput) []byte {
	for _, g := range im.Grid {
		b = binary.LittleEndian.AppendUint32(b, g)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(im.Pixels)))
	for _, v := range im.Pixels {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	if len(im.Grids) > 0 {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(im.Grids)))
		for _, g := range im.Grids {
			for _, v := range g {
				b = binary.LittleEndian.AppendUint32(b, v)
			}
		}
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
	if n < 0 || len(rest) < 4*n {
		return nil, fmt.Errorf("wire: an image frame holds %d bytes for %d pixel values", len(rest), n)
	}
	im.Pixels = make([]float32, n)
	for i := range im.Pixels {
		im.Pixels[i] = math.Float32frombits(binary.LittleEndian.Uint32(rest[4*i:]))
	}
	rest = rest[4*n:]
	if len(rest) == 0 {
		return im, nil
	}
	if len(rest) < 4 {
		return nil, ErrShort
	}
	k := int(binary.LittleEndian.Uint32(rest))
	rest = rest[4:]
	if k < 2 || len(rest) != 12*k {
		return nil, fmt.Errorf("wire: an image frame's grid list holds %d bytes for %d grids (a list needs at least 2)", len(rest), k)
	}
	im.Grids = make([][3]uint32, k)
	for i := range im.Grids {
		for j := range 3 {
			im.Grids[i][j] = binary.LittleEndian.Uint32(rest[12*i+4*j:])
		}
	}
	return im, nil
}

// DecodeSubmitImage parses a SubmitImage payload; the prompt is appended to ids.
func DecodeSubmitImage(p []byte, ids []int32) (uint64, Sampling, []int32, *ImageInput, error) {
	id, s, ids, err := DecodeSubmit(p, ids)
	if err != nil {
		return id, s, ids, nil, err
	}
	const fixed = submitFixed
	im, err := decodeImage(p[fixed+4+4*int(binary.LittleEndian.Uint32(p[fixed:])):])
	return id, s, ids, im, err
}
