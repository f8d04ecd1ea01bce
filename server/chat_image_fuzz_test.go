package server

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeContentParts: any JSON content list is either refused with a 400 naming a field
// or parsed into a string (no image) or parts with at most one image; nothing panics.
func FuzzDecodeContentParts(f *testing.F) {
	f.Add(`[{"type":"text","text":"hi"}]`, "user")
	f.Add(`[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},{"type":"text","text":"x"}]`, "user")
	f.Add(`[{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]`, "system")
	f.Add(`[{"type":"input_audio"}]`, "user")
	f.Fuzz(func(t *testing.T, raw, role string) {
		c, imgs, aerr := decodeContentParts("messages[0]", role, json.RawMessage(raw), 0, 1)
		if aerr != nil {
			if aerr.Status != 400 || aerr.Param == "" {
				t.Fatalf("refusal %+v lacks a 400 or a param", aerr)
			}
			return
		}
		if len(imgs) == 0 {
			if _, ok := c.(string); !ok {
				t.Fatalf("content without an image is %T, want the joined text", c)
			}
			return
		}
		if role != "user" || len(imgs) != 1 || len(imgs[0].Data) == 0 {
			t.Fatalf("accepted an image in a %s message or with no data", role)
		}
	})
}
