// Package vision is the image side of the vision-language chat route: it decodes one image,
// checks it before decoding (format, declared type, pixel count from the header), and turns it
// into the model's input exactly as the checkpoint's image processor does. Processors are
// registered by the image_processor_type of the checkpoint's preprocessor_config.json, or of the
// image_processor block of the processor_config.json transformers 5 saves (NewProcessor); each
// lives in its own file (qwen2vl.go: Qwen2-VL's, for the qwen3vl family; gotocr2.go: GOT-OCR2's
// tiling, for the internvl family).
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
	// Tiles is how many tiles a tiling processor cut the image into (GOT-OCR2: the thumbnail
	// included); 0 for a processor that does not tile.
	Tiles int
	// Pixels is pixel_values: Grid[0]*Grid[1]*Grid[2] rows of 3*temporal*patch*patch floats, in
	// the processor's patch order.
	Pixels []float32
	// Resized is the 8-bit resized RGB image (row-major, 3 bytes a pixel), before rescaling.
	Resized []uint8
}

// ModelConfigured is a processor that also reads the model's config.json (InternVL's
// image_seq_length and patch size live there, not in the image processor's file). The server
// calls UseModelConfig once, before the first image.
type ModelConfigured interface {
	UseModelConfig(config []byte) error
}

// Framed is a processor whose placeholder tokens the prompt wraps between a start and an end
// token (InternVL's <img> ... </img>): the chat template renders one placeholder and the
// server expands it to start, Result.Tokens placeholders, end.
type Framed interface {
	Frame() (start, end string)
}

// Stacking is a processor whose images stack into one engine input: every image's Grid has the
// same tile shape (Grid[1], Grid[2]) and the model encodes tiles independently, so several
// images are their tiles one after another (Grid[0] adds up) and their placeholder runs in
// order (InternVL). A processor without it takes one image per request.
type Stacking interface {
	StacksImages()
}

// OwnGrids is a processor whose images each keep their own grid (Qwen2-VL's native-resolution
// patches: images of different sizes have different grids): several images of a request go to
// the engine as a list, each through the vision tower on its own grid, with its own positions.
// A processor with neither OwnGrids nor Stacking takes one image per request.
type OwnGrids interface {
	KeepsOwnGrids()
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
// registered under it. It also takes transformers 5's processor_config.json, whose
// image_processor block holds the same settings (its top-level image_seq_length is kept).
func NewProcessor(preprocessorConfig []byte) (Processor, error) {
	var c struct {
		Type           *string         `json:"image_processor_type"`
		ImageProcessor json.RawMessage `json:"image_processor"`
		ImageSeqLength json.RawMessage `json:"image_seq_length"`
	}
	if err := json.Unmarshal(preprocessorConfig, &c); err != nil {
		return nil, fmt.Errorf("preprocessor_config.json: %w", err)
	}
	if c.Type == nil && len(c.ImageProcessor) > 0 {
		var block map[string]json.RawMessage
		if err := json.Unmarshal(c.ImageProcessor, &block); err != nil {
			return nil, fmt.Errorf("processor_config.json: image_processor: %w", err)
		}
		if _, ok := block["image_seq_length"]; !ok && len(c.ImageSeqLength) > 0 {
			block["image_seq_length"] = c.ImageSeqLength
		}
		b, err := json.Marshal(block)
		if err != nil {
			return nil, err
		}
		return NewProcessor(b)
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
