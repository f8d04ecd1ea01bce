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

// cImages converts ims to the C ABI's array, pinning every image's pixels (the array, Go memory
// holding Go pointers, may cross to C only with them pinned). The caller unpins.
func cImages(ims []*Image, pin *runtime.Pinner) ([]C.mq_image, error) {
	if len(ims) == 0 {
		return nil, errors.New("no images; pass at least one")
	}
	out := make([]C.mq_image, len(ims))
	for k, im := range ims {
		ci, err := im.c()
		if err != nil {
			if len(ims) > 1 {
				return nil, fmt.Errorf("image %d: %w", k, err)
			}
			return nil, err
		}
		pin.Pin(&im.Pixels[0])
		out[k] = ci
	}
	return out, nil
}

// AddImage is Add with one image (a family of task "vision"); the family checks the prompt's
// placeholder count against the image's grid.
func (e *Engine) AddImage(prompt []int32, im *Image, s Sampling) (SeqID, error) {
	return e.addImages("native.AddImage", prompt, []*Image{im}, s)
}

// AddImages is Add with several images, each on its own grid (Qwen3-VL: its own tower pass and
// positions): ims[k] is the image of the prompt's k-th placeholder run. A family or device that
// takes one image per sequence refuses more than one, naming qual-server's
// --max-images-per-request.
func (e *Engine) AddImages(prompt []int32, ims []*Image, s Sampling) (SeqID, error) {
	return e.addImages("native.AddImages", prompt, ims, s)
}

func (e *Engine) addImages(fn string, prompt []int32, ims []*Image, s Sampling) (SeqID, error) {
	if e.c == nil {
		return 0, ErrClosed
	}
	if len(prompt) == 0 {
		return 0, errors.New(fn + ": prompt is empty; pass at least one token id")
	}
	if s.MaxNewTokens < 1 {
		return 0, fmt.Errorf("%s: max_new_tokens %d must be >= 1", fn, s.MaxNewTokens)
	}
	if s.TopK < 0 || s.Temperature < 0 || s.TopP < 0 {
		return 0, fmt.Errorf("%s: temperature %g, top_k %d, top_p %g must not be negative", fn, s.Temperature, s.TopK, s.TopP)
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	ci, err := cImages(ims, &pin)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", fn, err)
	}
	cs := s.c()
	pin.Pin(&prompt[0])
	pin.Pin(&ci[0])
	var id C.uint64_t
	st, msg := call(func() C.mq_status {
		return C.mq_engine_add_images(e.c, (*C.int32_t)(unsafe.Pointer(&prompt[0])), C.int32_t(len(prompt)), &ci[0], C.int32_t(len(ci)), &cs, &id)
	})
	switch st {
	case C.MQ_OK:
		return SeqID(id), nil
	case C.MQ_ERR_BATCH_FULL:
		return 0, fmt.Errorf("%w: %s", ErrBatchFull, msg)
	default:
		return 0, errors.New(fn + ": " + msg)
	}
}

// LogitsImage is Logits with one image.
func (e *Engine) LogitsImage(ids []int32, im *Image) ([]float32, error) {
	return e.logitsImages("native.LogitsImage", ids, []*Image{im})
}

// LogitsImages is Logits with several images (see AddImages).
func (e *Engine) LogitsImages(ids []int32, ims []*Image) ([]float32, error) {
	return e.logitsImages("native.LogitsImages", ids, ims)
}

func (e *Engine) logitsImages(fn string, ids []int32, ims []*Image) ([]float32, error) {
	if e.c == nil {
		return nil, ErrClosed
	}
	if len(ids) == 0 {
		return nil, errors.New(fn + ": ids is empty; pass at least one token id")
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	ci, err := cImages(ims, &pin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fn, err)
	}
	out := make([]float32, len(ids)*e.info.VocabSize)
	pin.Pin(&ids[0])
	pin.Pin(&out[0])
	pin.Pin(&ci[0])
	st, msg := call(func() C.mq_status {
		return C.mq_engine_logits_images(e.c, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.int32_t(len(ids)), &ci[0], C.int32_t(len(ci)), (*C.float)(unsafe.Pointer(&out[0])))
	})
	if st != C.MQ_OK {
		return nil, errors.New(fn + ": " + msg)
	}
	return out, nil
}
