// Compiles models/qwen3.cc: cgo builds only the .cc files of the package directory itself.
#include "models/qwen3.cc"
