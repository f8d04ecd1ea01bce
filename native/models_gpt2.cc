// Compiles models/gpt2.cc: cgo builds only the .cc files of the package directory itself.
#include "models/gpt2.cc"
