package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// Write stores tensors as an F32 safetensors file. The references' tests use it to make
// checkpoints with known weights; data is rounded to float32 as a real checkpoint would be.
func Write(path string, tensors []Tensor) error {
	sorted := append([]Tensor(nil), tensors...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	hdr := map[string]any{}
	var data []byte
	for _, t := range sorted {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		if n != len(t.Data) {
			return fmt.Errorf("safetensors.Write: tensor %q shape %v needs %d values, has %d", t.Name, t.Shape, n, len(t.Data))
		}
		begin := len(data)
		for _, v := range t.Data {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(v)))
		}
		hdr[t.Name] = entry{DType: "F32", Shape: t.Shape, DataOffsets: []int64{int64(begin), int64(len(data))}}
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return fmt.Errorf("safetensors.Write: %w", err)
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(append(out, js...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("safetensors.Write: %w", err)
	}
	return nil
}
