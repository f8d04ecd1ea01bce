package ljpeg

// This file replaces image/jpeg's idct.go. It is written from the algorithm that libjpeg-turbo's
// jidctint.c (jpeg_idct_islow, the default JDCT_ISLOW method) implements: the Loeffler,
// Ligtenberg and Moschytz 8-point IDCT in 13-bit fixed point, columns first with 2 extra bits of
// precision kept between the passes, then rows, each output rounded by adding half and shifting
// right (DESCALE), level-shifted by 128 and limited through libjpeg's post-IDCT range table.
// Pillow decodes JPEG through libjpeg-turbo with these defaults, and transformers' image
// processors start from Pillow's pixels, so matching this to the bit is what makes a JPEG's
// pixel_values equal transformers'. Go's own IDCT rounds differently (off by up to a level).

type block [blockSize]int32

const blockSize = 8 * 8

const (
	constBits = 13
	pass1Bits = 2

	fix0_298631336 = 2446
	fix0_390180644 = 3196
	fix0_541196100 = 4433
	fix0_765366865 = 6270
	fix0_899976223 = 7373
	fix1_175875602 = 9633
	fix1_501321110 = 12299
	fix1_847759065 = 15137
	fix1_961570560 = 16069
	fix2_053119869 = 16819
	fix2_562915447 = 20995
	fix3_072711026 = 25172
)

// descale is libjpeg's DESCALE: x / 2^n rounded half up, with an arithmetic shift.
func descale(x int64, n uint) int64 { return (x + 1<<(n-1)) >> n }

// rangeLimit is libjpeg's IDCT range table indexed by (x & 1023): x + 128 limited to [0, 255]
// for |x| up to 511, and wrapping beyond as libjpeg's table does (only corrupt data gets there).
var rangeLimit = func() (t [1024]uint8) {
	for m := range t {
		switch {
		case m < 128:
			t[m] = uint8(m + 128)
		case m < 512:
			t[m] = 255
		case m < 896:
			t[m] = 0
		default:
			t[m] = uint8(m - 896)
		}
	}
	return
}()

// idct1D is the even/odd butterfly both passes share; in holds the 8 inputs (already
// dequantized), and out receives the 8 outputs before descaling.
func idct1D(in *[8]int64, out *[8]int64) {
	// Even part.
	z2, z3 := in[2], in[6]
	z1 := (z2 + z3) * fix0_541196100
	tmp2 := z1 + z3*(-fix1_847759065)
	tmp3 := z1 + z2*fix0_765366865
	tmp0 := (in[0] + in[4]) << constBits
	tmp1 := (in[0] - in[4]) << constBits
	tmp10, tmp13 := tmp0+tmp3, tmp0-tmp3
	tmp11, tmp12 := tmp1+tmp2, tmp1-tmp2

	// Odd part.
	tmp0, tmp1, tmp2, tmp3 = in[7], in[5], in[3], in[1]
	z1 = tmp0 + tmp3
	z2 = tmp1 + tmp2
	z3 = tmp0 + tmp2
	z4 := tmp1 + tmp3
	z5 := (z3 + z4) * fix1_175875602
	tmp0 *= fix0_298631336
	tmp1 *= fix2_053119869
	tmp2 *= fix3_072711026
	tmp3 *= fix1_501321110
	z1 *= -fix0_899976223
	z2 *= -fix2_562915447
	z3 *= -fix1_961570560
	z4 *= -fix0_390180644
	z3 += z5
	z4 += z5
	tmp0 += z1 + z3
	tmp1 += z2 + z4
	tmp2 += z2 + z3
	tmp3 += z1 + z4

	out[0], out[7] = tmp10+tmp3, tmp10-tmp3
	out[1], out[6] = tmp11+tmp2, tmp11-tmp2
	out[2], out[5] = tmp12+tmp1, tmp12-tmp1
	out[3], out[4] = tmp13+tmp0, tmp13-tmp0
}

// idctISLOW transforms one dequantized block (natural order) into 8x8 samples at dst.
func idctISLOW(b *block, dst []byte, stride int) {
	var ws [blockSize]int64
	var in, out [8]int64
	// Pass 1: columns, kept scaled up by 2^pass1Bits.
	for c := 0; c < 8; c++ {
		if b[8+c] == 0 && b[16+c] == 0 && b[24+c] == 0 && b[32+c] == 0 &&
			b[40+c] == 0 && b[48+c] == 0 && b[56+c] == 0 {
			dc := int64(b[c]) << pass1Bits // what the full butterfly gives for a DC-only column
			for r := 0; r < 8; r++ {
				ws[8*r+c] = dc
			}
			continue
		}
		for r := 0; r < 8; r++ {
			in[r] = int64(b[8*r+c])
		}
		idct1D(&in, &out)
		for r := 0; r < 8; r++ {
			// libjpeg stores the work array as int: the cast truncates to 32 bits.
			ws[8*r+c] = int64(int32(descale(out[r], constBits-pass1Bits)))
		}
	}
	// Pass 2: rows, removing the pass-1 scale and the factor 8 of the 2-D transform.
	for r := 0; r < 8; r++ {
		row := ws[8*r : 8*r+8]
		d := dst[r*stride : r*stride+8]
		copy(in[:], row)
		idct1D(&in, &out)
		for c := 0; c < 8; c++ {
			d[c] = rangeLimit[int32(descale(out[c], constBits+pass1Bits+3))&1023]
		}
	}
}
