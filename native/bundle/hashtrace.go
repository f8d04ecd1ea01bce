//go:build modelqual_hashtrace

package bundle

import (
	"fmt"
	"os"
)

// Built with -tags modelqual_hashtrace, every hashing pass over a bundle file is reported on
// stderr, so a test of a program made of several processes (qual-server's frontend and its
// workers) can count the passes of one start. Production builds leave traceHashPass nil.
func init() {
	traceHashPass = func(path string, size int) {
		fmt.Fprintf(os.Stderr, "modelqual_hashtrace: pid %d hashed bundle %s (%d bytes)\n", os.Getpid(), path, size)
	}
}
