// Package models compiles the native model families: one C++ file per family
// (native/models/<family>.cc), each registering itself with the runtime's registry at start-up
// (MQ_REGISTER_FAMILY in native/include/runtime.h). Adding a family is adding its file here:
// cgo compiles every .cc of this folder, so no list names it.
//
// The family files call the runtime (kernels, registry) that package native compiles; the two
// packages' objects are linked into one binary, which is why native imports this package and
// nothing else does.
package models

/*
#cgo CPPFLAGS: -I${SRCDIR}/../include
#cgo CXXFLAGS: -O3 -std=c++17 -march=x86-64-v3 -Wall -Wno-maybe-uninitialized -Wno-comment
#cgo LDFLAGS: -lstdc++ -lm
*/
import "C"

import (
	// A header edit changes this package's build key (see package include).
	_ "github.com/modelqual/modelqual/native/include"
)
