// Package imagecmp compares 8-bit images as image-generation gates do: PSNR and SSIM with
// scikit-image's definitions (skimage.metrics.peak_signal_noise_ratio and structural_similarity
// with data_range=255 and channel_axis=2), so a threshold written against diffusers' tooling
// means the same here. The values are checked against scikit-image's on stored image pairs.
package imagecmp

import (
	"fmt"
	"math"
)

// Image is row-major interleaved 8-bit pixels: Pix[(y*Width+x)*Channels+c].
type Image struct {
	Width, Height, Channels int
	Pix                     []byte
}

func check(a, b Image) error {
	if a.Width != b.Width || a.Height != b.Height || a.Channels != b.Channels {
		return fmt.Errorf("imagecmp: %dx%dx%d against %dx%dx%d: the images must have the same shape", a.Width, a.Height, a.Channels, b.Width, b.Height, b.Channels)
	}
	for _, m := range []Image{a, b} {
		if m.Width <= 0 || m.Height <= 0 || m.Channels <= 0 || len(m.Pix) != m.Width*m.Height*m.Channels {
			return fmt.Errorf("imagecmp: %d bytes for a %dx%dx%d image", len(m.Pix), m.Width, m.Height, m.Channels)
		}
	}
	return nil
}

// PSNR is 10 log10(255² / MSE) in dB over every sample; identical images give +Inf.
func PSNR(a, b Image) (float64, error) {
	if err := check(a, b); err != nil {
		return 0, err
	}
	var se float64
	for i := range a.Pix {
		d := float64(a.Pix[i]) - float64(b.Pix[i])
		se += d * d
	}
	mse := se / float64(len(a.Pix))
	return 10 * math.Log10(255*255/mse), nil
}

// winSize is scikit-image's default window (7x7, uniform weights, sample covariance).
const winSize = 7

// SSIM is the mean structural similarity (Wang et al. 2004) with scikit-image's defaults: per
// channel, 7x7 uniform windows, K1 = 0.01, K2 = 0.03, L = 255, sample covariance (N/(N-1)), the
// SSIM map averaged over pixels at least 3 from every border; the channels' means averaged.
// Images smaller than 7x7 are refused, as scikit-image refuses them.
func SSIM(a, b Image) (float64, error) {
	if err := check(a, b); err != nil {
		return 0, err
	}
	if a.Width < winSize || a.Height < winSize {
		return 0, fmt.Errorf("imagecmp: SSIM needs images of at least %dx%d, got %dx%d", winSize, winSize, a.Width, a.Height)
	}
	const (
		c1 = (0.01 * 255) * (0.01 * 255)
		c2 = (0.03 * 255) * (0.03 * 255)
	)
	np := float64(winSize * winSize)
	cov := np / (np - 1)
	w, h, ch, pad := a.Width, a.Height, a.Channels, winSize/2
	total := 0.0
	for c := 0; c < ch; c++ {
		sum := 0.0
		for y := pad; y < h-pad; y++ {
			for x := pad; x < w-pad; x++ {
				var sx, sy, sxx, syy, sxy float64
				for dy := -pad; dy <= pad; dy++ {
					for dx := -pad; dx <= pad; dx++ {
						i := ((y+dy)*w+(x+dx))*ch + c
						p, q := float64(a.Pix[i]), float64(b.Pix[i])
						sx += p
						sy += q
						sxx += p * p
						syy += q * q
						sxy += p * q
					}
				}
				ux, uy := sx/np, sy/np
				vx := cov * (sxx/np - ux*ux)
				vy := cov * (syy/np - uy*uy)
				vxy := cov * (sxy/np - ux*uy)
				sum += ((2*ux*uy + c1) * (2*vxy + c2)) / ((ux*ux + uy*uy + c1) * (vx + vy + c2))
			}
		}
		total += sum / float64((w-2*pad)*(h-2*pad))
	}
	return total / float64(ch), nil
}
