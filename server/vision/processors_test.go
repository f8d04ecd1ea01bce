package vision

import (
	"strings"
	"testing"
)

// TestNewProcessorByType checks that preprocessor_config.json's image_processor_type picks the
// processor, and that a missing or unknown type is refused with the field and the known names.
func TestNewProcessorByType(t *testing.T) {
	const qwen = `{"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
		"image_std": [0.5, 0.5, 0.5], "resample": 3, "size": {"shortest_edge": 4096, "longest_edge": 65536}, "image_processor_type": %q}`
	for _, name := range []string{"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"} {
		p, err := NewProcessor([]byte(strings.Replace(qwen, "%q", `"`+name+`"`, 1)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c, ok := p.(*Config)
		if !ok || c.MinPixels != 4096 || c.MaxPixels != 65536 || c.Factor() != 32 {
			t.Errorf("%s: got %#v, want the Qwen2-VL processor with min/max pixels 4096/65536 and factor 32", name, p)
		}
	}
	for _, c := range []struct{ name, config, want string }{
		{"unknown", strings.Replace(qwen, "%q", `"SiglipImageProcessor"`, 1), `image_processor_type "SiglipImageProcessor" is not implemented; known: GotOcr2ImageProcessor, GotOcr2ImageProcessorFast, Qwen2VLImageProcessor, Qwen2VLImageProcessorFast`},
		{"missing", `{"patch_size": 16}`, "image_processor_type is missing"},
		{"not JSON", `{`, "preprocessor_config.json: unexpected end of JSON input"},
		{"known type, unsupported setting", strings.Replace(strings.Replace(qwen, "%q", `"Qwen2VLImageProcessorFast"`, 1), `"resample": 3`, `"resample": 2`, 1), "resample is 2, not 3 (bicubic)"},
	} {
		_, err := NewProcessor([]byte(c.config))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to say %q", c.name, err, c.want)
		}
	}
}
