package native

/*
#include <stdlib.h>
#include "modelqual.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"sort"
	"unsafe"

	"github.com/modelqual/modelqual/native/bundle"
)

// FamilyInfo describes one registered native family: its name, its task and the
// architectures (config.json's architectures, or a diffusers pipeline's _class_name) it serves.
type FamilyInfo struct {
	Name          string   `json:"name"`
	Task          string   `json:"task"` // text | image | vision
	Architectures []string `json:"architectures"`
}

// Families lists the families compiled into this binary (each native/models/<family>.cc
// registers itself), sorted by name.
func Families() []FamilyInfo {
	n := int(C.mq_family_count())
	out := make([]FamilyInfo, 0, n)
	for i := 0; i < n; i++ {
		p := C.mq_family_info(C.int32_t(i))
		if p == nil {
			continue
		}
		var f FamilyInfo
		if err := json.Unmarshal([]byte(C.GoString(p)), &f); err == nil {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FamilyFor returns the family serving architecture arch, or an error naming the known ones.
func FamilyFor(arch string) (FamilyInfo, error) {
	var known []string
	for _, f := range Families() {
		for _, a := range f.Architectures {
			if a == arch {
				return f, nil
			}
			known = append(known, a)
		}
	}
	sort.Strings(known)
	return FamilyInfo{}, fmt.Errorf("architecture %q has no native family; known: %v (a family registers itself in native/models/<family>.cc)", arch, known)
}

// Resolve runs family's resolve step on config (config.json, or a pipeline's merged config):
// its canonical hyper-parameters with defaults filled in, or the family's refusal naming the
// config key. Every text family resolves "vocab_size" and "max_positions".
func Resolve(family string, config json.RawMessage) (map[string]any, error) {
	var hp map[string]any
	err := familyJSON(family, config, "resolved hyper-parameters", &hp, func(f *C.char, kv *C.mq_kv, n C.int32_t, out **C.char) C.mq_status {
		return C.mq_family_resolve(f, kv, n, out)
	})
	return hp, err
}

// Layout is the family's bundle.Layout for config: every tensor its CPU model reads with the
// shape config implies (listed by constructing the model over no data), what it carries without
// reading, and its layout rules (the names other checkpoint layouts give the same tensors, and
// what the reference loader discards). A config the model refuses at open is refused here,
// naming the key.
func Layout(family string, config json.RawMessage) (*bundle.Layout, error) {
	var l bundle.Layout
	err := familyJSON(family, config, "tensor layout", &l, func(f *C.char, kv *C.mq_kv, n C.int32_t, out **C.char) C.mq_status {
		return C.mq_family_layout(f, kv, n, out)
	})
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// familyJSON calls an mq_family_* function that answers JSON for family and config and decodes
// the answer into v (what names it in errors).
func familyJSON(family string, config json.RawMessage, what string, v any, fn func(*C.char, *C.mq_kv, C.int32_t, **C.char) C.mq_status) error {
	kvs, err := flattenConfig(config)
	if err != nil {
		return err
	}
	ck, free := cKV(kvs)
	defer free()
	cf := C.CString(family)
	defer C.free(unsafe.Pointer(cf))
	var out *C.char
	st, msg := call(func() C.mq_status { return fn(cf, ck.ptr, C.int32_t(ck.n), &out) })
	if st != C.MQ_OK {
		return fmt.Errorf("family %s: %s", family, msg)
	}
	defer C.mq_free(unsafe.Pointer(out))
	if err := json.Unmarshal([]byte(C.GoString(out)), v); err != nil {
		return fmt.Errorf("family %s: its %s: not JSON: %v", family, what, err)
	}
	return nil
}

// cKVs is a C array of mq_kv and the C memory behind it.
type cKVs struct {
	ptr *C.mq_kv
	n   int
}

// cKV copies kvs into C memory (keys, strings, lists); free releases all of it. No Go pointer
// is kept by C.
func cKV(kvs []kv) (cKVs, func()) {
	var allocs []unsafe.Pointer
	alloc := func(n int) unsafe.Pointer {
		p := C.calloc(C.size_t(max(n, 1)), 1)
		allocs = append(allocs, p)
		return p
	}
	cstr := func(s string) *C.char {
		p := C.CString(s)
		allocs = append(allocs, unsafe.Pointer(p))
		return p
	}
	free := func() {
		for _, p := range allocs {
			C.free(p)
		}
	}
	if len(kvs) == 0 {
		return cKVs{}, free
	}
	arr := unsafe.Slice((*C.mq_kv)(alloc(len(kvs)*int(unsafe.Sizeof(C.mq_kv{})))), len(kvs))
	for i, v := range kvs {
		arr[i].key = cstr(v.key)
		arr[i]._type = C.int32_t(v.kind)
		arr[i].number = C.double(v.number)
		switch v.kind {
		case kvString:
			arr[i].string = cstr(v.str)
		case kvNumbers:
			nums := unsafe.Slice((*C.double)(alloc(8*len(v.numbers))), len(v.numbers))
			for j, x := range v.numbers {
				nums[j] = C.double(x)
			}
			if len(nums) > 0 {
				arr[i].numbers = &nums[0]
			}
			arr[i].n = C.int32_t(len(v.numbers))
		case kvStrings:
			ps := unsafe.Slice((**C.char)(alloc(int(unsafe.Sizeof((*C.char)(nil)))*len(v.strs))), len(v.strs))
			for j, x := range v.strs {
				ps[j] = cstr(x)
			}
			if len(ps) > 0 {
				arr[i].strings = &ps[0]
			}
			arr[i].n = C.int32_t(len(v.strs))
		}
	}
	return cKVs{ptr: &arr[0], n: len(kvs)}, free
}

// BundleFamily is the runtime's bundle.Resolver: the registered family that serves arch, its
// task, its position limit as the family's resolve step reads it from config (so a config the
// family refuses is refused when the bundle is built, naming the key), and its tensor layout,
// against which the build normalises and checks the checkpoint's tensors.
func BundleFamily(arch string, config json.RawMessage) (bundle.Family, error) {
	f, err := FamilyFor(arch)
	if err != nil {
		return bundle.Family{}, err
	}
	hp, err := Resolve(f.Name, config)
	if err != nil {
		return bundle.Family{}, err
	}
	l, err := Layout(f.Name, config)
	if err != nil {
		return bundle.Family{}, err
	}
	return bundle.Family{Name: f.Name, Task: f.Task, MaxPositions: intParam(hp, "max_positions"), Layout: l}, nil
}
