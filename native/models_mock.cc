// Compiles models/mock.cc: cgo builds only the .cc files of the package directory itself.
#include "models/mock.cc"
