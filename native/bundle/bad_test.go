package bundle

import (
	"bytes"
	"crypto/sha256"
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
		{"truncated data", func() []byte { return good[:len(good)-100] }, "header.data.size", "truncated or extended"},
		{"extended data", func() []byte { return append(bytes.Clone(good), 0) }, "header.data.size", "truncated or extended"},
		{"bad magic", func() []byte { b := bytes.Clone(good); copy(b, "NOTABNDL"); return b }, "magic", `"NOTABNDL"`},
		{"unsupported version", func() []byte { b := bytes.Clone(good); binary.LittleEndian.PutUint32(b[8:], 3); return b }, "format_version", "3 is not supported"},
		{"version 1", func() []byte { b := bytes.Clone(good); binary.LittleEndian.PutUint32(b[8:], 1); return b }, "format_version", "1 is no longer read"},
		{"header edited, checksum not updated", func() []byte {
			return editHeader(t, good, func(h *Header) { h.Tensors[0].Offset, h.Tensors[1].Offset = h.Tensors[1].Offset, h.Tensors[0].Offset })
		}, "header_sha256", "the header was edited or corrupted"},
		{"provenance edited, checksum not updated", func() []byte {
			return editHeader(t, good, func(h *Header) { h.Provenance.CheckpointID = "evil/model" })
		}, "header_sha256", "mismatch"},
		{"header checksum corrupted", func() []byte { b := bytes.Clone(good); b[30] ^= 1; return b }, "header_sha256", "mismatch"},
		{"header length past EOF", func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint64(b[16:], uint64(len(b)))
			return b
		}, "header_length", "past end of file"},
		{"invalid JSON", func() []byte {
			b := bytes.Clone(good)
			b[prefixSize] = '['
			hlen := binary.LittleEndian.Uint64(b[16:24])
			sum := sha256.Sum256(b[prefixSize : prefixSize+int(hlen)])
			copy(b[24:56], sum[:])
			return b
		}, "header", "not valid JSON"},
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
		{"empty architecture", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Architecture = "" })
		}, "header.architecture", "is empty"},
		{"bad family name", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Family = "Qwen 3" })
		}, "header.family", "is not a family name"},
		{"unknown task", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Task = "audio" })
		}, "header.task", `"audio" is not one of`},
		{"tensor dtype differs from the storage dtype", func() []byte {
			return rewriteHeader(t, good, func(h *Header) {
				h.Tensors[0].DType, h.Tensors[0].Size = "BF16", h.Tensors[0].Size/2
			})
		}, "header.tensors[0].dtype", `differs from the build's storage dtype "F32"`},
		{"chunk list short", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Data.Chunks = h.Data.Chunks[:0] })
		}, "header.data.chunk_sha256", "has 0 entries"},
		{"non-immutable revision", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Provenance.Revision = "main" })
		}, "provenance.revision", `"main" is not an immutable 40-hex commit`},
		{"bad precision", func() []byte {
			return rewriteHeader(t, good, func(h *Header) { h.Provenance.Build.Precision = "int4" })
		}, "provenance.build", `precision "int4"`},
		{"corrupted section", func() []byte { b := bytes.Clone(good); b[secOff+3] ^= 0xff; return b },
			"header.data.chunk_sha256[0]", "it holds section tokenizer.json"},
		{"corrupted tensor data", func() []byte { b := bytes.Clone(good); b[len(b)-1] ^= 0x01; return b },
			"header.data.chunk_sha256[0]", "it holds"},
		{"corrupted header padding", func() []byte {
			b := bytes.Clone(good)
			hlen := int(binary.LittleEndian.Uint64(b[16:24]))
			if align(int64(prefixSize+hlen)) == int64(prefixSize+hlen) {
				t.Skip("the header ends on an alignment boundary: no padding")
			}
			b[prefixSize+hlen] = 1
			return b
		}, "header padding", "zero bytes"},
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

// TestDigestNamesTheHeader: a header edited with its checksum recomputed (two same-size tensors
// swapped: structurally valid, served silently by version 1) still opens, but as another
// bundle: its digest differs, which is what provenance records and fingerprints compare.
func TestDigestNamesTheHeader(t *testing.T) {
	path, good := buildTiny(t)
	b := must(Open(path))
	digest := b.Digest()
	b.Close()
	swapped := rewriteHeader(t, good, func(h *Header) {
		i, j := tensorIndex(h, "h.0.ln_1.weight"), tensorIndex(h, "h.0.ln_1.bias")
		h.Tensors[i].Offset, h.Tensors[j].Offset = h.Tensors[j].Offset, h.Tensors[i].Offset
	})
	b2 := must(Open(writeTemp(t, "swapped.mqb", swapped)))
	defer b2.Close()
	if b2.Digest() == digest {
		t.Fatalf("a bundle with two tensors swapped has the original's digest %s", digest)
	}
}
