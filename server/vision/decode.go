package vision

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"

	"github.com/modelqual/modelqual/server/vision/internal/ljpeg"
)

// Image is a decoded image converted to 8-bit RGB, with what a request record keeps of it.
type Image struct {
	Format        string // "png" | "jpeg"
	Width, Height int
	RGB           []uint8 // row-major, 3 bytes a pixel
	BytesSHA256   string  // of the encoded bytes as sent
	PixelsSHA256  string  // of RGB
}

// ErrBadImage wraps every refusal of Decode; its message names the reason.
var ErrBadImage = errors.New("bad image")

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, a...))
}

// Sniff names the format of data from its signature: "png", "jpeg" or "".
func Sniff(data []byte) string {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return "png"
	case bytes.HasPrefix(data, []byte{0xff, 0xd8, 0xff}):
		return "jpeg"
	}
	return ""
}

// Decode checks and decodes one image. mime is the type the client declared (a data: URL's
// media type; "" when none): it must agree with the bytes. maxPixels bounds width x height as
// read from the header before any pixel is decoded, so a small file that would expand into a
// huge image (a decompression bomb) costs nothing.
func Decode(data []byte, mime string, maxPixels int) (*Image, error) {
	if len(data) == 0 {
		return nil, bad("the image is empty")
	}
	format := Sniff(data)
	if format == "" {
		return nil, bad("the bytes are neither PNG nor JPEG (supported: image/png, image/jpeg)")
	}
	if mime != "" {
		want := map[string]string{"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg"}[mime]
		if want == "" {
			return nil, bad("media type %q is not supported (image/png, image/jpeg)", mime)
		}
		if want != format {
			return nil, bad("declared media type %q disagrees with the bytes, which are %s", mime, format)
		}
	}
	var cfg image.Config
	var err error
	if format == "png" {
		cfg, err = png.DecodeConfig(bytes.NewReader(data))
	} else {
		cfg, err = ljpeg.DecodeConfig(bytes.NewReader(data))
	}
	if err != nil {
		return nil, bad("the %s header does not decode: %v", format, err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, bad("the image is %dx%d", cfg.Width, cfg.Height)
	}
	if int64(cfg.Width)*int64(cfg.Height) > int64(maxPixels) {
		return nil, bad("the image is %dx%d = %d pixels, over the limit of %d (checked from the header, before decoding)",
			cfg.Width, cfg.Height, int64(cfg.Width)*int64(cfg.Height), maxPixels)
	}
	var im image.Image
	if format == "png" {
		im, err = png.Decode(bytes.NewReader(data))
	} else {
		im, err = ljpeg.Decode(bytes.NewReader(data))
	}
	if err != nil {
		return nil, bad("the %s data does not decode: %v", format, err)
	}
	var rgb []uint8
	if ycc, ok := im.(*image.YCbCr); ok {
		// A colour JPEG: the planes come from libjpeg-turbo's IDCT (package ljpeg); upsample
		// and convert as libjpeg-turbo does, so the pixels are Pillow's to the bit.
		rgb = libjpegRGB(ycc)
	} else {
		rgb = ToRGB(im)
	}
	b := im.Bounds()
	bs, ps := sha256.Sum256(data), sha256.Sum256(rgb)
	return &Image{Format: format, Width: b.Dx(), Height: b.Dy(), RGB: rgb,
		BytesSHA256: hex.EncodeToString(bs[:]), PixelsSHA256: hex.EncodeToString(ps[:])}, nil
}

// ToRGB converts an image to 8-bit RGB as transformers 5.17's convert_to_rgb does with Pillow
// (image.convert("RGB")): colours are kept and any alpha channel is dropped, not composited
// (the golden corpus's RGBA image shows it: its pixels hash equal to the straight RGB values).
// Grey levels are replicated; palette indices are looked up; 16-bit samples keep their high byte.
func ToRGB(im image.Image) []uint8 {
	b := im.Bounds()
	w, h := b.Dx(), b.Dy()
	out := make([]uint8, w*h*3)
	i := 0
	put := func(r, g, bl, _ uint8) {
		out[i], out[i+1], out[i+2] = r, g, bl
		i += 3
	}
	switch m := im.(type) {
	case *image.Gray:
		for y := 0; y < h; y++ {
			for _, v := range m.Pix[y*m.Stride : y*m.Stride+w] {
				put(v, v, v, 255)
			}
		}
	case *image.NRGBA:
		for y := 0; y < h; y++ {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			for x := 0; x < w; x++ {
				put(row[4*x], row[4*x+1], row[4*x+2], row[4*x+3])
			}
		}
	case *image.RGBA: // PNG RGB without alpha decodes here, opaque
		for y := 0; y < h; y++ {
			row := m.Pix[y*m.Stride : y*m.Stride+4*w]
			for x := 0; x < w; x++ {
				c := color.NRGBAModel.Convert(color.RGBA{row[4*x], row[4*x+1], row[4*x+2], row[4*x+3]}).(color.NRGBA)
				put(c.R, c.G, c.B, c.A)
			}
		}
	case *image.YCbCr: // Go's conversion; Decode converts JPEG planes with libjpegRGB instead
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				yi, ci := m.YOffset(x, y), m.COffset(x, y)
				r, g, bl := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				put(r, g, bl, 255)
			}
		}
	default:
		for y := b.Min.Y; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				c := color.NRGBA64Model.Convert(im.At(x, y)).(color.NRGBA64)
				put(uint8(c.R>>8), uint8(c.G>>8), uint8(c.B>>8), uint8(c.A>>8))
			}
		}
	}
	return out
}
