package vision

import "image"

// libjpegRGB converts the planes of a decoded YCbCr JPEG to 8-bit RGB as libjpeg-turbo does
// with its decompression defaults (do_fancy_upsampling on, merged upsampling therefore off),
// which is what Pillow runs and so what transformers' image processors see:
//
//   - chroma upsampling: h2v1 and h2v2 "fancy" (triangle filter with libjpeg's alternating
//     rounding biases) when the downsampled width is over 2, h1v2 fancy for 4:4:0, and plain
//     replication otherwise (4:1:1, 4:1:0, very narrow images); edge samples are repeated, as
//     libjpeg's context rows and first/last-column cases amount to;
//   - colour: jdcolor.c's 16-bit fixed-point YCbCr->RGB (FIX(1.402), FIX(1.772),
//     FIX(0.71414), FIX(0.34414), rounding added before the shift), limited to [0, 255].
//
// Go's color.YCbCrToRGB and image/jpeg's replication of chroma differ from that by up to a few
// levels, enough to move pixel_values and the logits of a vision-language model.
func libjpegRGB(m *image.YCbCr) []uint8 {
	b := m.Bounds()
	w, h := b.Dx(), b.Dy()
	hx, vx := 1, 1
	switch m.SubsampleRatio {
	case image.YCbCrSubsampleRatio422:
		hx = 2
	case image.YCbCrSubsampleRatio420:
		hx, vx = 2, 2
	case image.YCbCrSubsampleRatio440:
		vx = 2
	case image.YCbCrSubsampleRatio411:
		hx = 4
	case image.YCbCrSubsampleRatio410:
		hx, vx = 4, 2
	}
	dw, dh := (w+hx-1)/hx, (h+vx-1)/vx // libjpeg's downsampled_width and _height
	cb := upsample(m.Cb[m.COffset(b.Min.X, b.Min.Y):], m.CStride, dw, dh, hx, vx, w, h)
	cr := upsample(m.Cr[m.COffset(b.Min.X, b.Min.Y):], m.CStride, dw, dh, hx, vx, w, h)
	out := make([]uint8, 3*w*h)
	for y := 0; y < h; y++ {
		yrow := m.Y[m.YOffset(b.Min.X, b.Min.Y+y):]
		for x := 0; x < w; x++ {
			yy := int32(yrow[x])
			cbv, crv := cb[y*w+x], cr[y*w+x]
			o := out[3*(y*w+x):]
			o[0] = clamp8(yy + crR[crv])
			o[1] = clamp8(yy + (cbG[cbv]+crG[crv])>>16)
			o[2] = clamp8(yy + cbB[cbv])
		}
	}
	return out
}

// The jdcolor.c tables: x = sample - 128; FIX(v) = round(v * 2^16).
var crR, cbB, crG, cbG = func() (crR, cbB, crG, cbG [256]int32) {
	const half = 1 << 15
	for i := range 256 {
		x := int32(i - 128)
		crR[i] = (91881*x + half) >> 16 // FIX(1.40200)
		cbB[i] = (116130*x + half) >> 16
		crG[i] = -46802 * x      // -FIX(0.71414)
		cbG[i] = -22554*x + half // -FIX(0.34414), with the rounding of the G sum
	}
	return
}()

func clamp8(v int32) uint8 {
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// upsample expands one chroma plane (dw x dh samples at p with the given stride) by hx x vx to
// a w x h plane, as libjpeg-turbo's jdsample.c selects and computes it.
func upsample(p []uint8, stride, dw, dh, hx, vx, w, h int) []uint8 {
	out := make([]uint8, w*h)
	at := func(x, y int) int32 { // edge samples repeated
		x = min(max(x, 0), dw-1)
		y = min(max(y, 0), dh-1)
		return int32(p[y*stride+x])
	}
	switch {
	case hx == 1 && vx == 1:
		for y := 0; y < h; y++ {
			copy(out[y*w:(y+1)*w], p[y*stride:y*stride+w])
		}
	case hx == 2 && vx == 1 && dw > 2: // h2v1_fancy_upsample
		for y := 0; y < h; y++ {
			for i := 0; i < dw; i++ {
				c := 3 * at(i, y)
				put(out, w, 2*i, y, (c+at(i-1, y)+1)>>2)
				put(out, w, 2*i+1, y, (c+at(i+1, y)+2)>>2)
			}
		}
	case hx == 1 && vx == 2: // h1v2_fancy_upsample
		for j := 0; j < dh; j++ {
			for i := 0; i < dw; i++ {
				c := 3 * at(i, j)
				put(out, w, i, 2*j, (c+at(i, j-1)+1)>>2)
				put(out, w, i, 2*j+1, (c+at(i, j+1)+2)>>2)
			}
		}
	case hx == 2 && vx == 2 && dw > 2: // h2v2_fancy_upsample
		for j := 0; j < dh; j++ {
			for v := 0; v < 2; v++ {
				n := j - 1 // the next nearest row: above for the upper output row, below for the lower
				if v == 1 {
					n = j + 1
				}
				sum := func(i int) int32 { return 3*at(i, j) + at(i, n) }
				for i := 0; i < dw; i++ {
					c := 3 * sum(i)
					put(out, w, 2*i, 2*j+v, (c+sum(i-1)+8)>>4)
					put(out, w, 2*i+1, 2*j+v, (c+sum(i+1)+7)>>4)
				}
			}
		}
	default: // int_upsample, h2v1_upsample, h2v2_upsample: replication
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				out[y*w+x] = uint8(at(x/hx, y/vx))
			}
		}
	}
	return out
}

// put stores v at (x, y) of a w-wide plane unless the upsampled block overhangs the image
// (an odd width or height).
func put(out []uint8, w, x, y int, v int32) {
	if x < w && y*w+x < len(out) {
		out[y*w+x] = uint8(v)
	}
}
