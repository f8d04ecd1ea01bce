// Package vision is the image side of the vision-language chat route: it decodes one image,
// checks it before decoding (format, declared type, pixel count from the header), and turns it
// into the model's input exactly as the checkpoint's image processor does. Processors are
// registered by the image_processor_type of the checkpoint's preprocessor_config.json
// (NewProcessor); each lives in its own file (qwen2vl.go: Qwen2-VL's, for the qwen3vl family).
//
// Why exact: the processor's output is the model's input; a resize that differs by one grey
// level moves the logits, and the parity gates compare against transformers bit for bit.
package vision

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Processor turns one decoded RGB image (row-major, 3 bytes a pixel) into a model's input, as
// the checkpoint's own image processor does.
type Processor interface {
	Preprocess(rgb []uint8, width, height int) (*Result, error)
}

// Result is one image prepared for the model.
type Result struct {
	Width, Height               int // the RGB image's size
	ResizedWidth, ResizedHeight int
	// Grid is image_grid_thw: temporal, height and width in patches.
	Grid [3]int
	// Tokens is the number of image placeholder tokens (Qwen's <|image_pad|>) the prompt
	// carries for the image.
	Tokens int
	// Pixels is pixel_values: Grid[0]*Grid[1]*Grid[2] rows of 3*temporal*patch*patch floats, in
	// the processor's patch order.
	Pixels []float32
	// Resized is the 8-bit resized RGB image (row-major, 3 bytes a pixel), before rescaling.
	Resized []uint8
}

// NewProcessorFunc builds a processor from the checkpoint's preprocessor_config.json, refusing
// settings it does not implement.
type NewProcessorFunc func(preprocessorConfig []byte) (Processor, error)

// The processors by the image_processor_type names they answer to. Each processor's file
// registers its names in an init function, so a new one sits beside the others without an
// edit here (as native/models/<family>.cc registers a family).
// Registration happens in init functions only, so the map needs no lock.
var processors = map[string]NewProcessorFunc{}

// Register makes a processor known under the image_processor_type names that transformers
// gives it (a slow and a fast class name usually). It panics on an empty or duplicate name: two
// processors claiming one checkpoint is a programming error.
func Register(fn NewProcessorFunc, names ...string) {
	for _, n := range names {
		if n == "" {
			panic("vision: Register with an empty image_processor_type")
		}
		if _, dup := processors[n]; dup {
			panic("vision: image_processor_type " + n + " registered twice")
		}
		processors[n] = fn
	}
}

// Processors lists the registered image_processor_type names, sorted.
func Processors() []string {
	names := make([]string, 0, len(processors))
	for n := range processors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// NewProcessor reads preprocessor_config.json's image_processor_type and builds the processor
// registered under it.
func NewProcessor(preprocessorConfig []byte) (Processor, error) {
	var c struct {
		Type *string `json:"image_processor_type"`
	}
	if err := json.Unmarshal(preprocessorConfig, &c); err != nil {
		return nil, fmt.Errorf("preprocessor_config.json: %w", err)
	}
	known := strings.Join(Processors(), ", ")
	if c.Type == nil || *c.Type == "" {
		return nil, fmt.Errorf("preprocessor_config.json: image_processor_type is missing; it names the checkpoint's image processor, one of %s", known)
	}
	fn, ok := processors[*c.Type]
	if !ok {
		return nil, fmt.Errorf("preprocessor_config.json: image_processor_type %q is not implemented; known: %s (a new processor registers itself in its own file of package server/vision)", *c.Type, known)
	}
	return fn(preprocessorConfig)
}
