package bundle

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// stTensor is one tensor of a safetensors file: its dtype, shape and absolute byte span.
type stTensor struct {
	Name   string
	DType  string
	Shape  []int64
	Offset int64 // absolute in file
	Size   int64
	File   string
}

// readSafetensorsHeader parses a safetensors file's header (8-byte LE length, JSON table
// name -> {dtype, shape, data_offsets}) and checks every span against the file size.
// Format: https://github.com/huggingface/safetensors#format
func readSafetensorsHeader(path string) ([]stTensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bundle: open safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("bundle: stat safetensors %s: %w", path, err)
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("bundle: safetensors %s: header length: %v (file truncated?)", path, err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > uint64(st.Size()-8) || hlen > maxHeaderLen {
		return nil, fmt.Errorf("bundle: safetensors %s: header length %d past end of file (size %d)", path, hlen, st.Size())
	}
	raw := make([]byte, hlen)
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, fmt.Errorf("bundle: safetensors %s: header: %v", path, err)
	}
	var table map[string]json.RawMessage
	if err := json.Unmarshal(raw, &table); err != nil {
		return nil, fmt.Errorf("bundle: safetensors %s: header is not a JSON object: %v", path, err)
	}
	base := int64(8 + hlen)
	var out []stTensor
	for name, v := range table {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType       string  `json:"dtype"`
			Shape       []int64 `json:"shape"`
			DataOffsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(v, &e); err != nil || len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("bundle: safetensors %s: tensor %q: entry is malformed", path, name)
		}
		b, en := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || en < b || base+en > st.Size() {
			return nil, fmt.Errorf("bundle: safetensors %s: tensor %q: data_offsets [%d,%d] outside the file (size %d)", path, name, b, en, st.Size())
		}
		out = append(out, stTensor{Name: name, DType: e.DType, Shape: e.Shape, Offset: base + b, Size: en - b, File: path})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// stDTypeSize covers the dtypes a checkpoint's float weights may use.
var stDTypeSize = map[string]int64{"F32": 4, "F16": 2, "BF16": 2}

// elements checks the tensor's byte size against its shape and returns the element count.
func (t stTensor) elements() (int64, error) {
	es, ok := stDTypeSize[t.DType]
	if !ok {
		return 0, fmt.Errorf("bundle: safetensors %s: tensor %q has dtype %s; only F32, F16, BF16 can be converted", t.File, t.Name, t.DType)
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, fmt.Errorf("bundle: safetensors %s: tensor %q has a bad shape %v", t.File, t.Name, t.Shape)
		}
		n *= d
	}
	if n*es != t.Size {
		return 0, fmt.Errorf("bundle: safetensors %s: tensor %q: %d bytes for shape %v of %s (want %d)", t.File, t.Name, t.Size, t.Shape, t.DType, n*es)
	}
	return n, nil
}

// copyAs streams a tensor from its file to w in dtype (F32, BF16 or F16), converting as torch's
// Tensor.to does: widening exactly, narrowing with round-to-nearest-even.
func copyAs(w io.Writer, r io.ReaderAt, t stTensor, dtype string) error {
	es := stDTypeSize[t.DType]
	os := dtypeSize[dtype]
	const chunkElems = 1 << 20
	in := make([]byte, chunkElems*es)
	out := make([]byte, chunkElems*os)
	for off := int64(0); off < t.Size; {
		n := min(int64(len(in)), t.Size-off)
		if _, err := r.ReadAt(in[:n], t.Offset+off); err != nil {
			return fmt.Errorf("bundle: read tensor %q from %s: %w", t.Name, t.File, err)
		}
		elems := n / es
		var o []byte
		if t.DType == dtype {
			o = in[:n]
		} else {
			for i := int64(0); i < elems; i++ {
				var f float32
				switch t.DType {
				case "F32":
					f = math.Float32frombits(binary.LittleEndian.Uint32(in[4*i:]))
				case "BF16":
					f = math.Float32frombits(uint32(binary.LittleEndian.Uint16(in[2*i:])) << 16)
				case "F16":
					f = f16ToF32(binary.LittleEndian.Uint16(in[2*i:]))
				}
				switch dtype {
				case "F32":
					binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
				case "BF16":
					binary.LittleEndian.PutUint16(out[2*i:], f32ToBF16(f))
				case "F16":
					binary.LittleEndian.PutUint16(out[2*i:], f32ToF16(f))
				}
			}
			o = out[:elems*os]
		}
		if _, err := w.Write(o); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// f32ToBF16 rounds to the nearest bfloat16, ties to even; NaN stays a (quiet) NaN.
func f32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// f32ToF16 rounds to the nearest IEEE binary16, ties to even, with overflow to infinity and
// gradual underflow to subnormals and zero; NaN stays a (quiet) NaN.
func f32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	mant := u & 0x7fffff
	switch {
	case exp == 0xff:
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127+15 >= 0x1f:
		return sign | 0x7c00
	case exp-127+15 <= 0:
		// Subnormal or zero: shift the full significand (with its hidden bit) into place.
		if exp-127+15 < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint32(14 - (exp - 127 + 15))
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	e := uint32(exp-127+15) << 10
	half := e | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, up to infinity: still correct
	}
	return sign | uint16(half)
}

// f16ToF32 converts IEEE 754 binary16 to float32 exactly (subnormals, inf and NaN included).
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: value = mant * 2^-24
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
