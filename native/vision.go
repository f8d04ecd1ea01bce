package native

/*
#include "modelqual.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Image is one image of a vision-language prompt as the family's processor prepared it:
// pixel_values in the processor's patch order and the grid in patches (temporal, height,
// width). The prompt passed with it carries one placeholder token per image token.
type Image struct {
	Pixels []float32
	Grid   [3]int
}

func (im *Image) c() (C.mq_image, error) {
	if im == nil || len(im.Pixels) == 0 {
		return C.mq_image{}, errors.New("image has no pixel values")
	}
	return C.mq_image{
		pixels:   (*C.float)(unsafe.Pointer(&im.Pixels[0])),
		n_pixels: C.int64_t(len(im.Pixels)),
		grid_t:   C.int32_t(im.Grid[0]),
		grid_h:   C.int32_t(im.Grid[1]),
		grid_w:   C.int32_t(im.Grid[2]),
	}, nil
}

// AddImage is Add with one image (a family of task "vision"); the family checks the prompt's
// placeholder count against the image's grid.
func (e *Engine) AddImage(prompt []int32, im *Image, s Sampling) (SeqID, error) {
	if e.c == nil {
		return 0, ErrClosed
	}
	if len(prompt) == 0 {
		return 0, errors.New("native.AddImage: prompt is empty; pass at least one token id")
	}
	if s.MaxNewTokens < 1 {
		return 0, fmt.Errorf("native.AddImage: max_new_tokens %d must be >= 1", s.MaxNewTokens)
	}
	if s.TopK < 0 || s.Temperature < 0 || s.TopP < 0 {
		return 0, fmt.Errorf("native.AddImage: temperature %g, top_k %d, top_p %g must not be negative", s.Temperature, s.TopK, s.TopP)
	}
	ci, err := im.c()
	if err != nil {
		return 0, fmt.Errorf("native.AddImage: %w", err)
	}
	cs := s.c()
	var pin runtime.Pinner
	pin.Pin(&prompt[0])
	pin.Pin(&im.Pixels[0])
	defer pin.Unpin()
	var id C.uint64_t
	st, msg := call(func() C.mq_status {
		return C.mq_engine_add_image(e.c, (*C.int32_t)(unsafe.Pointer(&prompt[0])), C.int32_t(len(prompt)), &ci, &cs, &id)
	})
	switch st {
	case C.MQ_OK:
		return SeqID(id), nil
	case C.MQ_ERR_BATCH_FULL:
		return 0, fmt.Errorf("%w: %s", ErrBatchFull, msg)
	default:
		return 0, errors.New("native.AddImage: " + msg)
	}
}

// LogitsImage is Logits with one image.
func (e *Engine) LogitsImage(ids []int32, im *Image) ([]float32, error) {
	if e.c == nil {
		return nil, ErrClosed
	}
	if len(ids) == 0 {
		return nil, errors.New("native.LogitsImage: ids is empty; pass at least one token id")
	}
	ci, err := im.c()
	if err != nil {
		return nil, fmt.Errorf("native.LogitsImage: %w", err)
	}
	out := make([]float32, len(ids)*e.info.VocabSize)
	var pin runtime.Pinner
	pin.Pin(&ids[0])
	pin.Pin(&out[0])
	pin.Pin(&im.Pixels[0])
	defer pin.Unpin()
	st, msg := call(func() C.mq_status {
		return C.mq_engine_logits_image(e.c, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.int32_t(len(ids)), &ci, (*C.float)(unsafe.Pointer(&out[0])))
	})
	if st != C.MQ_OK {
		return nil, errors.New("native.LogitsImage: " + msg)
	}
	return out, nil
}
