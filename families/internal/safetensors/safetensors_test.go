package safetensors

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	in := []Tensor{{Name: "b", Shape: []int{2, 3}, Data: []float64{1, 2, 3, 4, 5, -6.5}}, {Name: "a", Shape: []int{1}, Data: []float64{0.25}}}
	if err := Write(path, in); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Get("b", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if b.Data[5] != -6.5 || b.DType != "F32" {
		t.Errorf("b = %v (%s), want last value -6.5 F32", b.Data, b.DType)
	}
	if _, err := f.Get("b", 3, 2); err == nil || !strings.Contains(err.Error(), `"b" has shape [2 3]`) {
		t.Errorf("shape mismatch error = %v, want one naming the tensor and its shape", err)
	}
	if _, err := f.Get("missing"); err == nil || !strings.Contains(err.Error(), `"missing" missing`) {
		t.Errorf("missing tensor error = %v", err)
	}
}

func TestHalfPrecision(t *testing.T) {
	// 0x3c00 is 1.0 in binary16; 0xc000 is -2.0; 0x3f80 is 1.0 in bfloat16.
	for h, want := range map[uint16]float64{0x3c00: 1, 0xc000: -2, 0x0001: 5.960464477539063e-08} {
		if got := halfToFloat(h); got != want {
			t.Errorf("halfToFloat(%#x) = %v, want %v", h, got, want)
		}
	}
	hdr := []byte(`{"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`)
	raw := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	raw = append(append(raw, hdr...), 0x80, 0x3f)
	f, err := Parse("bf16", raw)
	if err != nil {
		t.Fatal(err)
	}
	if x, _ := f.Get("x"); x.Data[0] != 1 {
		t.Errorf("bf16 0x3f80 = %v, want 1", x.Data[0])
	}
}

func TestBadFiles(t *testing.T) {
	cases := map[string][]byte{
		"shorter than the 8-byte":      {1, 2},
		"past end of file":             binary.LittleEndian.AppendUint64(nil, 1000),
		"outside the data section":     withHeader(`{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`),
		"the reference reads F64, F32": withHeader(`{"x":{"dtype":"I64","shape":[0],"data_offsets":[0,0]}}`),
		"needs 8 bytes":                withHeader(`{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,0]}}`),
	}
	for want, raw := range cases {
		if _, err := Parse("bad", raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) error = %v, want it to contain %q", raw, err, want)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none")); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Errorf("Open of a missing file: %v", err)
	}
}

func withHeader(h string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}
