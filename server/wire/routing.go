package wire

import (
	"encoding/binary"
	"fmt"
)

// TypeRouting (worker → parent) follows a step of a mixture-of-experts engine that routed
// tokens: per (layer, expert), the tokens routed there since the last such frame. It goes
// before the step's Done frames, so a client reading /metrics after its response sees them.
// A parent that predates it skips it.
const TypeRouting uint8 = 16

// RoutingDelta is how many tokens one layer sent to one expert.
type RoutingDelta struct {
	Layer, Expert uint16
	Tokens        uint32
}

// Routing buffers a Routing frame: u32 n, then n × (u16 layer, u16 expert, u32 tokens).
func (w *Writer) Routing(ds []RoutingDelta) {
	s := w.begin(TypeRouting)
	b := binary.LittleEndian.AppendUint32(w.buf, uint32(len(ds)))
	for _, d := range ds {
		b = binary.LittleEndian.AppendUint16(b, d.Layer)
		b = binary.LittleEndian.AppendUint16(b, d.Expert)
		b = binary.LittleEndian.AppendUint32(b, d.Tokens)
	}
	w.buf = b
	w.end(s)
}

// DecodeRouting decodes a Routing frame's payload, calling fn for each delta.
func DecodeRouting(p []byte, fn func(RoutingDelta)) error {
	if len(p) < 4 {
		return ErrShort
	}
	n := int(binary.LittleEndian.Uint32(p))
	if len(p) != 4+8*n {
		return fmt.Errorf("wire: routing frame of %d bytes for %d entries", len(p), n)
	}
	for i := 0; i < n; i++ {
		q := p[4+8*i:]
		fn(RoutingDelta{Layer: binary.LittleEndian.Uint16(q), Expert: binary.LittleEndian.Uint16(q[2:]), Tokens: binary.LittleEndian.Uint32(q[4:])})
	}
	return nil
}
