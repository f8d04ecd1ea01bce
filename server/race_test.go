//go:build race

package server_test

// Under `go test -race` the qual-server binary the tests run is race-instrumented too, so the
// frontend's and workers' concurrency is checked end to end, not just the test process.
func init() { raceBuild = true }
