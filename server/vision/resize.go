package vision

import "math"

// ResizeBicubic resizes an 8-bit RGB image (row-major, 3 bytes a pixel) as torchvision's
// resize(..., BICUBIC, antialias=True) does on a uint8 tensor on the CPU (PyTorch's
// _upsample_bicubic2d_aa uint8 kernel, itself modelled on Pillow's ImagingResample): separable
// passes, horizontal then vertical, each rounding to 8 bits; per output pixel the Keys cubic
// (a = -0.5) widened by the scale when shrinking, normalised in float64, then quantised to int16
// with the largest precision that keeps the largest weight under 2^15, and applied in integer
// arithmetic with rounding and clamping. A pass whose size does not change is skipped.
func ResizeBicubic(src []uint8, w, h, ow, oh int) []uint8 {
	cur, cw := src, w
	if ow != w {
		cur = pass(cur, w, h, ow, true)
		cw = ow
	}
	if oh != h {
		cur = pass(cur, cw, h, oh, false)
	}
	if ow == w && oh == h {
		cur = append([]uint8(nil), src...)
	}
	return cur
}

// cubicAA is the antialiasing bicubic filter with a = -0.5 (PyTorch's aa_filter for bicubic,
// chosen for compatibility with Pillow).
func cubicAA(x float64) float64 {
	const a = -0.5
	x = math.Abs(x)
	if x < 1 {
		return ((a+2)*x-(a+3))*x*x + 1
	}
	if x < 2 {
		return ((a*x-5*a)*x+8*a)*x - 4*a
	}
	return 0
}

// weights are one dimension's int16 filter taps: output i reads in[start[i] : start[i]+size[i]]
// with taps[i*stride : ...] at precision bits.
type weights struct {
	start, size []int
	taps        []int32
	stride      int
	precision   uint
}

func computeWeights(in, out int) weights {
	scale := float64(in) / float64(out)
	support := 2.0 // interp_size 4 * 0.5
	invscale := 1.0
	if scale >= 1 {
		support *= scale
		invscale = 1 / scale
	}
	stride := int(math.Ceil(support))*2 + 1
	wt := make([]float64, out*stride)
	ws := weights{start: make([]int, out), size: make([]int, out), stride: stride}
	wmax := 0.0
	for i := 0; i < out; i++ {
		center := scale * (float64(i) + 0.5)
		xmin := max(int64(center-support+0.5), 0) // C++ truncation toward zero
		xsize := min(int64(center+support+0.5), int64(in)) - xmin
		row := wt[i*stride : (i+1)*stride]
		total := 0.0
		for j := int64(0); j < xsize; j++ {
			v := cubicAA((float64(j+xmin) - center + 0.5) * invscale)
			row[j] = v
			total += v
		}
		if total != 0 {
			for j := int64(0); j < xsize; j++ {
				row[j] /= total
				wmax = math.Max(wmax, row[j])
			}
		}
		ws.start[i], ws.size[i] = int(xmin), int(xsize)
	}
	var prec uint
	for prec = 0; prec < 22; prec++ {
		if int(0.5+wmax*float64(int(1)<<(prec+1))) >= 1<<15 {
			break
		}
	}
	ws.precision = prec
	ws.taps = make([]int32, len(wt))
	for j, v := range wt {
		v *= float64(int(1) << prec)
		if v < 0 {
			ws.taps[j] = int32(int16(v - 0.5))
		} else {
			ws.taps[j] = int32(int16(v + 0.5))
		}
	}
	return ws
}

// pass resamples one dimension of an RGB image of w x h: horizontal (to out columns) or
// vertical (to out rows).
func pass(src []uint8, w, h, out int, horizontal bool) []uint8 {
	inLen := h
	if horizontal {
		inLen = w
	}
	ws := computeWeights(inLen, out)
	initial := int32(1) << (ws.precision - 1)
	clip := func(v int32) uint8 {
		v >>= ws.precision
		if v < 0 {
			return 0
		}
		if v > 255 {
			return 255
		}
		return uint8(v)
	}
	if horizontal {
		dst := make([]uint8, out*h*3)
		for y := 0; y < h; y++ {
			srow := src[y*w*3 : (y+1)*w*3]
			for x := 0; x < out; x++ {
				taps := ws.taps[x*ws.stride:]
				s0 := ws.start[x]
				r, g, b := initial, initial, initial
				for j := 0; j < ws.size[x]; j++ {
					k := taps[j]
					p := srow[(s0+j)*3:]
					r += int32(p[0]) * k
					g += int32(p[1]) * k
					b += int32(p[2]) * k
				}
				d := dst[(y*out+x)*3:]
				d[0], d[1], d[2] = clip(r), clip(g), clip(b)
			}
		}
		return dst
	}
	dst := make([]uint8, w*out*3)
	for y := 0; y < out; y++ {
		taps := ws.taps[y*ws.stride:]
		s0 := ws.start[y]
		for x := 0; x < w*3; x++ {
			acc := initial
			for j := 0; j < ws.size[y]; j++ {
				acc += int32(src[(s0+j)*w*3+x]) * taps[j]
			}
			dst[y*w*3+x] = clip(acc)
		}
	}
	return dst
}
