package worker

import (
	"bytes"
	"testing"

	"github.com/modelqual/modelqual/server/wire"
)

// routingEngine is a fakeEngine of a mixture of experts whose routing counts the test sets.
type routingEngine struct {
	fakeEngine
	counts [][]uint64
}

func (r *routingEngine) Routing() ([][]uint64, error) {
	out := make([][]uint64, len(r.counts))
	for i, row := range r.counts {
		out[i] = append([]uint64(nil), row...)
	}
	return out, nil
}

// After a step, a mixture-of-experts engine's routing goes to the parent as what the step
// added: on the first report every expert of a layer that routed anything (zeros too, so
// /metrics lists the experts never chosen), later only the (layer, expert) pairs that grew.
// A dense layer (all zeros) is never reported.
func TestReportRoutingSendsWhatEachStepAdded(t *testing.T) {
	eng := &routingEngine{counts: [][]uint64{{2, 0, 1}, {0, 0, 0}}}
	var buf bytes.Buffer
	l := &loop{eng: eng, out: wire.NewWriter(&buf)}
	read := func() map[[2]int]uint32 {
		t.Helper()
		if err := l.out.Flush(); err != nil {
			t.Fatal(err)
		}
		got := map[[2]int]uint32{}
		if buf.Len() == 0 {
			return got
		}
		r := wire.NewReader(&buf)
		typ, pl, err := r.Next()
		if err != nil || typ != wire.TypeRouting {
			t.Fatalf("frame type %d, %v; want a routing frame", typ, err)
		}
		if err := wire.DecodeRouting(pl, func(d wire.RoutingDelta) { got[[2]int{int(d.Layer), int(d.Expert)}] = d.Tokens }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	l.reportRouting()
	first := read()
	if len(first) != 3 || first[[2]int{0, 0}] != 2 || first[[2]int{0, 1}] != 0 || first[[2]int{0, 2}] != 1 {
		t.Fatalf("first report %v, want layer 0's three experts (2, 0, 1) and nothing of dense layer 1", first)
	}
	eng.counts[0][1] += 5
	l.reportRouting()
	if got := read(); len(got) != 1 || got[[2]int{0, 1}] != 5 {
		t.Fatalf("second report %v, want only layer 0 expert 1 +5", got)
	}
	l.reportRouting()
	if got := read(); len(got) != 0 {
		t.Fatalf("a step that routed nothing sent %v", got)
	}
}
