package bundle

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenRejectsBadBundles covers every malformed-bundle case: each must be an error naming
// the file and the field, never a panic, and never a successfully opened bundle.
func TestOpenRejectsBadBundles(t *testing.T) {
	_, good := buildTiny(t)
	h, _ := parseFile(t, good)
	secOff := h.Sections[0].Offset
	cases := []struct {
		name   string
		mutate func() []byte
		field  string // must appear in the error
		detail string // must appear too
	}{
		{"truncated prefix", func() []byte { return good[:10] }, "file", "truncated"},
		{"truncated data", func() []byte { return good[:len(good)-100] }, "header.tensor", "past end of file"},
		{"bad magic", func() []byte { b := bytes.Clone(good); copy(b, "NOTABNDL"); return b }, "magic", `"NOTABNDL"`},
		{"unsupported version", func() []byte { b := bytes.Clone(good); binary.LittleEndian.PutUint32(b[8:], 2); return b }, "format_version", "2 is not supported"},
		{"header length past EOF", func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint64(b[16:], uint64(len(b)))
			return b
		}, "header_length", "past end of file"},
		{"invalid JSON", func() []byte { b := bytes.Clone(good); b[24] = '['; return b }, "header", "not valid JSON"},
		{"section offset out of range", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections[1].Offset = align(int64(len(good))) + 64 })
		}, "header.sections[1].offset", "past end of file"},
		{"section offset inside header", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections[0].Offset = 0 })
		}, "header.sections[0].offset", "inside the header"},
		{"sections overlap", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections[1].Offset = secOff })
		}, "header.sections[", "overlaps"},
		{"section misaligned", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections[2].Offset += 8 })
		}, "header.sections[2].offset", "not 64-byte aligned"},
		{"missing section", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections = h.Sections[:3] })
		}, "header.sections", `lacks the "config.json" section`},
		{"duplicate section", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Sections[3].Name = h.Sections[0].Name })
		}, "header.sections[3].name", "appears twice"},
		{"tensor misaligned", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Tensors[2].Offset += 4 })
		}, "header.tensors[2].offset", "not 64-byte aligned"},
		{"tensor size != shape × dtype", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Tensors[0].Size -= 4 })
		}, "header.tensors[0].size", "!= shape"},
		{"tensors overlap", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Tensors[1].Offset = h.Tensors[0].Offset })
		}, "header.tensors[", "overlaps"},
		{"tensor outside tensor data", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.TensorData.Size -= 64 })
		}, "header.tensors[", "outside header.tensor_data"},
		{"tensor dtype", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Tensors[0].DType = "Q4" })
		}, "header.tensors[0].dtype", `"Q4" is not supported`},
		{"missing tensor", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Tensors = h.Tensors[1:] })
		}, "header.tensors", "is missing"},
		{"misshaped tensor", func() []byte {
			return rewriteHeader(t, good, func(h *Header) {
				i := tensorIndex(h, "wte.weight")
				h.Tensors[i].Shape = []int64{4, 6}
			})
		}, "header.tensors", `tensor "wte.weight" has shape [4 6], but config.json implies [6 4]`},
		{"unknown architecture", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Architecture = "LlamaForCausalLM" })
		}, "header.architecture", `"LlamaForCausalLM" is not known`},
		{"family does not match architecture", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Family = "qwen3" })
		}, "header.family", "does not match"},
		{"non-immutable revision", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Provenance.Revision = "main" })
		}, "provenance.revision", `"main" is not an immutable 40-hex commit`},
		{"bad precision", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Provenance.Build.Precision = "int4" })
		}, "provenance.build", `precision "int4"`},
		{"corrupted section", func() []byte { b := bytes.Clone(good); b[secOff+3] ^= 0xff; return b },
			"header.sections[0].sha256", "mismatch for section \"tokenizer.json\""},
		{"corrupted tensor data", func() []byte { b := bytes.Clone(good); b[len(b)-1] ^= 0x01; return b },
			"header.tensor_data.sha256", "mismatch"},
		{"empty file", func() []byte { return nil }, "file", "truncated"},
		{"header config differs from its section", func() []byte {
			return rewriteHeader(t, good, func(h *Header) {
				h.Config = []byte(strings.Replace(string(h.Config), `"layer_norm_epsilon":0.00001`, `"layer_norm_epsilon":0.00002`, 1))
			})
		}, "header.config", "differs from the config.json section"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeTemp(t, "bad.mqb", c.mutate())
			b, err := Open(path)
			if err == nil {
				b.Close()
				t.Fatal("Open accepted a bad bundle")
			}
			msg := err.Error()
			for _, want := range []string{"bundle " + path + ": ", c.field, c.detail} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Errorf("error is %T, want *FormatError", err)
			}
		})
	}
}

func TestOpenMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.mqb")
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), p) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open(missing) = %v", err)
	}
}

func tensorIndex(h *Header, name string) int {
	for i, t := range h.Tensors {
		if t.Name == name {
			return i
		}
	}
	panic("no tensor " + name)
}
