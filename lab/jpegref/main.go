//go:build jpegref

// Command jpegref checks server/vision's JPEG decoding against the libjpeg-turbo installed on
// this machine (Debian's libjpeg62-turbo-dev), beyond the three corpus JPEGs whose Pillow pixels
// the goldens hold: it encodes synthetic images with libjpeg at every chroma sampling libjpeg's
// upsampler distinguishes (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, grayscale), odd and tiny sizes,
// baseline and progressive, with and without restart markers, decodes them with libjpeg's
// defaults (JDCT_ISLOW, fancy upsampling: what Pillow runs) and compares the RGB with
// vision.Decode's, byte for byte. Lab only (cgo + -ljpeg, hence the build tag):
//
//	go run -tags jpegref ./lab/jpegref
package main

/*
#cgo LDFLAGS: -ljpeg
#include <stdio.h>
#include <stdlib.h>
#include <jpeglib.h>

// encode writes rgb (w*h*3) as a JPEG with the given sampling factors of component 0 (the
// chroma components are 1x1), gray (one component), progressive and restart interval (MCU rows).
static unsigned char *encode(const unsigned char *rgb, int w, int h, int hs, int vs, int gray,
                             int progressive, int restart, int quality, unsigned long *size) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr e;
  unsigned char *out = NULL;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  jpeg_mem_dest(&c, &out, size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  if (gray) jpeg_set_colorspace(&c, JCS_GRAYSCALE);
  jpeg_set_quality(&c, quality, TRUE);
  c.comp_info[0].h_samp_factor = hs;
  c.comp_info[0].v_samp_factor = vs;
  if (progressive) jpeg_simple_progression(&c);
  c.restart_in_rows = restart;
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)(rgb + (size_t)c.next_scanline * w * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return out;
}

// decode decodes with libjpeg's defaults to RGB (w*h*3).
static unsigned char *decode(const unsigned char *data, unsigned long n, int *w, int *h) {
  struct jpeg_decompress_struct d;
  struct jpeg_error_mgr e;
  d.err = jpeg_std_error(&e);
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, data, n);
  jpeg_read_header(&d, TRUE);
  d.out_color_space = JCS_RGB;
  jpeg_start_decompress(&d);
  *w = d.output_width;
  *h = d.output_height;
  unsigned char *out = malloc((size_t)d.output_width * d.output_height * 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = out + (size_t)d.output_scanline * d.output_width * 3;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return out;
}
*/
import "C"

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image/jpeg"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/modelqual/modelqual/server/vision"
)

func main() {
	type sampling struct {
		name   string
		hs, vs int
		gray   bool
	}
	samplings := []sampling{{"4:4:4", 1, 1, false}, {"4:2:2", 2, 1, false}, {"4:2:0", 2, 2, false},
		{"4:4:0", 1, 2, false}, {"4:1:1", 4, 1, false}, {"gray", 1, 1, true}}
	sizes := [][2]int{{1, 1}, {2, 3}, {3, 2}, {5, 7}, {17, 9}, {33, 31}, {64, 48}, {127, 65}, {300, 17}}
	// With JPEGREF_OUT=DIR, a few cases are written there with the sha256 of libjpeg's RGB
	// (libjpeg.json), for server/vision's regression test.
	outDir := os.Getenv("JPEGREF_OUT")
	keep := map[string]bool{"4:2:0 127x65 1 1": true, "4:2:2 33x31 0 1": true, "4:4:0 17x9 1 0": true,
		"4:1:1 300x17 0 0": true, "4:2:0 5x7 0 0": true}
	written := map[string]string{}
	cases, bad := 0, 0
	for _, s := range samplings {
		for _, sz := range sizes {
			for _, prog := range []int{0, 1} {
				for _, restart := range []int{0, 1} {
					w, h := sz[0], sz[1]
					rgb := synth(w, h, uint64(w*131+h*7+prog))
					var n C.ulong
					p := C.encode((*C.uchar)(unsafe.Pointer(&rgb[0])), C.int(w), C.int(h), C.int(s.hs), C.int(s.vs),
						cbool(s.gray), C.int(prog), C.int(restart), 85, &n)
					jpg := C.GoBytes(unsafe.Pointer(p), C.int(n))
					C.free(unsafe.Pointer(p))
					var dw, dh C.int
					q := C.decode((*C.uchar)(unsafe.Pointer(&jpg[0])), C.ulong(len(jpg)), &dw, &dh)
					ref := C.GoBytes(unsafe.Pointer(q), C.int(int(dw)*int(dh)*3))
					C.free(unsafe.Pointer(q))
					im, err := vision.Decode(jpg, "image/jpeg", 1<<26)
					cases++
					if err != nil {
						bad++
						_, gerr := jpeg.Decode(bytes.NewReader(jpg))
						fmt.Printf("%-6s %4dx%-4d prog %d rst %d: vision.Decode: %v (Go's image/jpeg: %v)\n", s.name, w, h, prog, restart, err, gerr)
						continue
					}
					if keep[fmt.Sprintf("%s %dx%d %d %d", s.name, w, h, prog, restart)] && outDir != "" {
						name := fmt.Sprintf("%s-%dx%d-prog%d-rst%d.jpg", strings.ReplaceAll(s.name, ":", ""), w, h, prog, restart)
						if err := os.WriteFile(filepath.Join(outDir, name), jpg, 0o644); err != nil {
							panic(err)
						}
						sum := sha256.Sum256(ref)
						written[name] = hex.EncodeToString(sum[:])
					}
					maxd, ndiff := 0, 0
					for i := range ref {
						if d := int(math.Abs(float64(ref[i]) - float64(im.RGB[i]))); d > 0 {
							ndiff++
							maxd = max(maxd, d)
						}
					}
					if ndiff > 0 {
						bad++
						fmt.Printf("%-6s %4dx%-4d prog %d rst %d: %d of %d bytes differ, max %d levels\n", s.name, w, h, prog, restart, ndiff, len(ref), maxd)
					}
				}
			}
		}
	}
	if outDir != "" {
		b, _ := json.MarshalIndent(map[string]any{"decoder": "libjpeg-turbo 2.1.5 (Debian libjpeg62-turbo), JDCT_ISLOW, fancy upsampling, JCS_RGB", "rgb_sha256": written}, "", "  ")
		if err := os.WriteFile(filepath.Join(outDir, "libjpeg.json"), append(b, '\n'), 0o644); err != nil {
			panic(err)
		}
	}
	fmt.Printf("libjpeg-turbo (%s) vs vision.Decode: %d of %d JPEGs bit-identical\n", libVersion(), cases-bad, cases)
	if bad > 0 {
		os.Exit(1)
	}
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func libVersion() string { return fmt.Sprintf("JPEG_LIB_VERSION %d", int(C.JPEG_LIB_VERSION)) }

// synth is smooth gradients plus noise and a few sharp edges, so every coefficient band and
// the range limits are exercised.
func synth(w, h int, seed uint64) []byte {
	out := make([]byte, w*h*3)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			seed = seed*6364136223846793005 + 1442695040888963407
			n := int(seed>>58) - 32
			for c := 0; c < 3; c++ {
				v := (x*255/max(w-1, 1)*(c+1) + y*255/max(h-1, 1)*(3-c)) / 3
				if (x/5+y/3+c)%4 == 0 {
					v = 255 - v
				}
				out[(y*w+x)*3+c] = byte(min(max(v+n, 0), 255))
			}
		}
	}
	return out
}
