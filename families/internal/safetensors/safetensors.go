// Package safetensors reads Hugging Face safetensors files into float64 tensors for the
// family-owned reference implementations. It is deliberately independent of native/bundle:
// a reference must not share a loader with the engine it checks, or a loader bug would
// cancel out in the comparison.
//
// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype","shape","data_offsets":[begin,end]}, "__metadata__": {...}},
// then the tensor data; offsets are relative to the end of the header.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// Tensor is one tensor converted to float64, row-major.
type Tensor struct {
	Name  string
	DType string // as stored: F32, F16, BF16, F64
	Shape []int
	Data  []float64
}

// File is a parsed safetensors file, fully read into memory as float64.
type File struct {
	Path     string
	Metadata map[string]string
	tensors  map[string]*Tensor
}

type entry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// maxHeader bounds the JSON header so a corrupted length cannot make us allocate gigabytes.
const maxHeader = 100 << 20

// Open reads and converts every tensor of the file at path.
func Open(path string) (*File, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	return Parse(path, raw)
}

// Parse converts an in-memory safetensors file; name is used in error messages.
func Parse(name string, raw []byte) (*File, error) {
	if len(raw) < 8 {
		return nil, fmt.Errorf("safetensors %s: file is %d bytes, shorter than the 8-byte header length; the checkpoint is truncated", name, len(raw))
	}
	n := binary.LittleEndian.Uint64(raw[:8])
	if n > maxHeader || 8+n > uint64(len(raw)) {
		return nil, fmt.Errorf("safetensors %s: header length %d past end of file (size %d); the checkpoint is truncated or not safetensors", name, n, len(raw))
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		return nil, fmt.Errorf("safetensors %s: header JSON: %w", name, err)
	}
	data := raw[8+n:]
	f := &File{Path: name, tensors: map[string]*Tensor{}}
	for key, msg := range hdr {
		if key == "__metadata__" {
			if err := json.Unmarshal(msg, &f.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors %s: __metadata__: %w", name, err)
			}
			continue
		}
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("safetensors %s: tensor %q: %w", name, key, err)
		}
		t, err := convert(name, key, e, data)
		if err != nil {
			return nil, err
		}
		f.tensors[key] = t
	}
	return f, nil
}

func convert(file, key string, e entry, data []byte) (*Tensor, error) {
	if len(e.DataOffsets) != 2 || e.DataOffsets[0] < 0 || e.DataOffsets[1] < e.DataOffsets[0] || e.DataOffsets[1] > int64(len(data)) {
		return nil, fmt.Errorf("safetensors %s: tensor %q data_offsets %v outside the data section (%d bytes)", file, key, e.DataOffsets, len(data))
	}
	count := 1
	for _, d := range e.Shape {
		if d < 0 {
			return nil, fmt.Errorf("safetensors %s: tensor %q has negative dimension in shape %v", file, key, e.Shape)
		}
		count *= d
	}
	var width int
	switch e.DType {
	case "F64":
		width = 8
	case "F32":
		width = 4
	case "F16", "BF16":
		width = 2
	default:
		return nil, fmt.Errorf("safetensors %s: tensor %q has dtype %s; the reference reads F64, F32, F16 and BF16", file, key, e.DType)
	}
	b := data[e.DataOffsets[0]:e.DataOffsets[1]]
	if len(b) != count*width {
		return nil, fmt.Errorf("safetensors %s: tensor %q shape %v dtype %s needs %d bytes, data_offsets give %d", file, key, e.Shape, e.DType, count*width, len(b))
	}
	out := make([]float64, count)
	for i := range out {
		switch e.DType {
		case "F64":
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		case "F32":
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case "BF16":
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		case "F16":
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return &Tensor{Name: key, DType: e.DType, Shape: append([]int(nil), e.Shape...), Data: out}, nil
}

// halfToFloat converts IEEE 754 binary16 to float64.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * frac * math.Pow(2, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * (1 + frac/1024) * math.Pow(2, float64(exp-15))
}

// Names lists the tensor names in sorted order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.tensors))
	for n := range f.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Has reports whether the file holds a tensor named name.
func (f *File) Has(name string) bool { _, ok := f.tensors[name]; return ok }

// Get returns the tensor name, checking its shape so that a checkpoint that disagrees with
// its config.json fails here, naming the tensor, instead of producing wrong numbers later.
func (f *File) Get(name string, shape ...int) (*Tensor, error) {
	t, ok := f.tensors[name]
	if !ok {
		return nil, fmt.Errorf("safetensors %s: tensor %q missing; the checkpoint does not match its config.json", f.Path, name)
	}
	if len(shape) > 0 {
		ok := len(shape) == len(t.Shape)
		for i := 0; ok && i < len(shape); i++ {
			ok = shape[i] == t.Shape[i]
		}
		if !ok {
			return nil, fmt.Errorf("safetensors %s: tensor %q has shape %v, config.json implies %v", f.Path, name, t.Shape, shape)
		}
	}
	return t, nil
}
