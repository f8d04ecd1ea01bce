// Command imgcmp prints PSNR (dB) and SSIM of two PNGs with qual/imagecmp (scikit-image's
// definitions), for lab/flux/run_emu.sh: imgcmp A.png B.png [min_psnr]; with min_psnr it exits 1
// when the PSNR is below it.
package main

import (
	"fmt"

	"image/png"
	"os"
	"strconv"

	"github.com/modelqual/modelqual/qual/imagecmp"
)

func load(path string) imagecmp.Image {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer f.Close()
	m, err := png.Decode(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, path, err)
		os.Exit(2)
	}
	b := m.Bounds()
	out := imagecmp.Image{Width: b.Dx(), Height: b.Dy(), Channels: 3, Pix: make([]byte, 0, b.Dx()*b.Dy()*3)}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := m.At(x, y).RGBA()
			out.Pix = append(out.Pix, byte(r>>8), byte(g>>8), byte(bl>>8))
		}
	}
	return out
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: imgcmp A.png B.png [min_psnr]")
		os.Exit(2)
	}
	a, b := load(os.Args[1]), load(os.Args[2])
	p, err := imagecmp.PSNR(a, b)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s, err := imagecmp.SSIM(a, b)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("psnr %.2f ssim %.5f\n", p, s)
	if len(os.Args) > 3 {
		min, _ := strconv.ParseFloat(os.Args[3], 64)
		if p < min {
			os.Exit(1)
		}
	}
}
