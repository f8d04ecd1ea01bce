package native

/*
#include "modelqual.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// TorchRandn returns what torch.randn(n, generator=torch.Generator("cpu").manual_seed(seed))
// draws (float32): the initial latents a diffusers pipeline makes for seed, flattened.
func TorchRandn(seed uint64, n int) ([]float32, error) {
	if n < 0 {
		return nil, fmt.Errorf("native.TorchRandn: n %d is negative", n)
	}
	out := make([]float32, n)
	if n == 0 {
		return out, nil
	}
	if st := C.mq_torch_randn(C.uint64_t(seed), (*C.float)(unsafe.Pointer(&out[0])), C.int64_t(n)); st != C.MQ_OK {
		return nil, fmt.Errorf("native.TorchRandn: status %d", int(st))
	}
	return out, nil
}
