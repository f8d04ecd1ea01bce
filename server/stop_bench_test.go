package server

import (
	"net/http"
	"testing"
)

// pushPieces is decoded token text as the stream decoder hands it over: words, a multi-byte
// character, and pieces that begin a stop string of benchPushStops but do not complete it
// ("\n" then "The", "</" then "b>", "Use" then "ful"), so the matcher's hold and release paths
// run as well as its plain pass-through.
var pushPieces = [][]byte{
	[]byte(" The"), []byte(" capital"), []byte(" of"), []byte(" France"), []byte(" is"),
	[]byte(" Paris"), []byte("."), []byte("\n"), []byte("The"), []byte(" café"), []byte(" 世界"),
	[]byte(" </"), []byte("b>"), []byte(" Use"), []byte("ful"), []byte(" text"),
}

var benchPushStops = []string{"\n\n", "</answer>", "User:"}

// benchmarkPush measures gen.push on the streaming path (text through the stop matcher into
// an SSE chunk). One op pushes all of pushPieces, 16 tokens, so allocs/op counts allocations
// per 16 tokens (the testing package truncates allocs/op to an integer, which would show
// 0.9 allocations per token as 0). The write buffer and the collected output are reset as
// send and a bounded response would, so only push's own allocations count.
func benchmarkPush(b *testing.B, stops []string) {
	g := &gen{s: &Server{}, req: &GenRequest{}, stop: newStopMatcher(stops, false),
		prefix: []byte(`data: {"choices":[{"index":0,"text":"`), suffix: []byte(`"}]}` + "\n\n"),
		buf: make([]byte, 0, 4096), out: make([]byte, 0, 1<<16)}
	g.w = nopResponseWriter{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, p := range pushPieces {
			g.push(p)
			g.buf = g.buf[:0]
		}
		if g.stopped {
			b.Fatal("a stop string matched; the benchmark text must not contain one")
		}
		g.out = g.out[:0]
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(pushPieces)), "ns/token")
}

func BenchmarkPushNoStops(b *testing.B)   { benchmarkPush(b, nil) }
func BenchmarkPushWithStops(b *testing.B) { benchmarkPush(b, benchPushStops) }

// nopResponseWriter stands in for the client connection: push only appends to g.buf.
type nopResponseWriter struct{}

func (nopResponseWriter) Header() http.Header         { return http.Header{} }
func (nopResponseWriter) Write(p []byte) (int, error) { return len(p), nil }
func (nopResponseWriter) WriteHeader(int)             {}
