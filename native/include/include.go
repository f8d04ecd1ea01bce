// Package include holds the native runtime's headers: the C ABI (modelqual.h), the device
// backend ABI (mq_backend.h) and the runtime's internals shared with the family model files
// (runtime.h).
//
// Why a Go package for headers: cgo compiles a package's C++ with the headers it includes, but
// the go command hashes only the package's own files into its build key, so an edit to a header
// outside the package would leave a stale object behind. Embedding the headers here makes them
// this package's content; the cgo packages that include them (native, native/models) import it,
// so a header edit changes their build key and they are recompiled.
package include

import "embed"

// Headers are the runtime's headers, embedded so that editing one rebuilds every cgo package
// importing this one.
//
//go:embed *.h
var Headers embed.FS
