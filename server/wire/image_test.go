package wire

import (
	"bytes"
	"reflect"
	"testing"
)

func TestImageFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	req := ImageRequest{Prompt: []int32{1, 2, 3}, Negative: []int32{4}, Width: 96, Height: 64, Steps: 4, Guidance: 3.5, Seed: 1 << 62}
	if err := w.Image(7, req); err != nil {
		t.Fatal(err)
	}
	w.ImageResult(ImageAnswer{ID: 7, PipelineNs: 123, EncodeNs: 45, PNG: []byte("\x89PNG...")})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	typ, p, err := r.Next()
	if err != nil || typ != TypeImage {
		t.Fatalf("first frame: type %d, %v", typ, err)
	}
	id, got, err := DecodeImage(p)
	if err != nil || id != 7 || !reflect.DeepEqual(got, req) {
		t.Fatalf("image request: id %d %+v %v", id, got, err)
	}
	typ, p, err = r.Next()
	if err != nil || typ != TypeImageResult {
		t.Fatalf("second frame: type %d, %v", typ, err)
	}
	a, err := DecodeImageResult(p)
	if err != nil || a.ID != 7 || a.PipelineNs != 123 || a.EncodeNs != 45 || string(a.PNG) != "\x89PNG..." {
		t.Fatalf("image result: %+v %v", a, err)
	}
	if _, err := DecodeImageResult(p[:10]); err == nil {
		t.Error("a truncated image result decoded")
	}
}
