// Package numeric holds the float64 linear algebra the family references share: dense
// row-major matrices over gonum's BLAS, causal attention against a key/value cache, argmax and
// top-k. It holds no family names and no model rules (norms, activations, position encodings
// and weight layouts stay in each family's reference, written from that architecture's
// definition).
package numeric

import (
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// Matrix is a dense row-major float64 matrix.
type Matrix struct {
	Rows, Cols int
	Data       []float64
}

// NewMatrix allocates a zero rows×cols matrix.
func NewMatrix(rows, cols int) Matrix {
	return Matrix{Rows: rows, Cols: cols, Data: make([]float64, rows*cols)}
}

// Row returns row i as a slice aliasing the matrix.
func (m Matrix) Row(i int) []float64 { return m.Data[i*m.Cols : (i+1)*m.Cols] }

func (m Matrix) general() blas64.General {
	stride := m.Cols
	if stride == 0 {
		stride = 1
	}
	return blas64.General{Rows: m.Rows, Cols: m.Cols, Stride: stride, Data: m.Data}
}

// MulT returns x·wᵀ (+ bias), the nn.Linear convention: w is out×in. It panics when the
// inner dimensions disagree, which is a bug in the reference, not bad input.
func MulT(x, w Matrix, bias []float64) Matrix {
	if x.Cols != w.Cols {
		panic(fmt.Sprintf("numeric.MulT: x is %dx%d, w is %dx%d", x.Rows, x.Cols, w.Rows, w.Cols))
	}
	return gemm(x, w, blas.Trans, w.Rows, bias)
}

// Mul returns x·w (+ bias), the Conv1D convention: w is in×out. It panics when the inner
// dimensions disagree.
func Mul(x, w Matrix, bias []float64) Matrix {
	if x.Cols != w.Rows {
		panic(fmt.Sprintf("numeric.Mul: x is %dx%d, w is %dx%d", x.Rows, x.Cols, w.Rows, w.Cols))
	}
	return gemm(x, w, blas.NoTrans, w.Cols, bias)
}

// gemm returns x·op(w) (+ bias) with out columns; the bias is laid into y first and gemm
// accumulates onto it (beta 1).
func gemm(x, w Matrix, tw blas.Transpose, out int, bias []float64) Matrix {
	y := NewMatrix(x.Rows, out)
	addBias(y, bias)
	beta := 0.0
	if bias != nil {
		beta = 1
	}
	blas64.Gemm(blas.NoTrans, tw, 1, x.general(), w.general(), beta, y.general())
	return y
}

func addBias(y Matrix, bias []float64) {
	if bias == nil {
		return
	}
	if len(bias) != y.Cols {
		panic(fmt.Sprintf("numeric: bias has %d entries for %d columns", len(bias), y.Cols))
	}
	for i := 0; i < y.Rows; i++ {
		copy(y.Row(i), bias)
	}
}

// AddInPlace sets a += b elementwise (the residual connection).
func AddInPlace(a, b Matrix) {
	if len(a.Data) != len(b.Data) {
		panic(fmt.Sprintf("numeric.AddInPlace: %dx%d + %dx%d", a.Rows, a.Cols, b.Rows, b.Cols))
	}
	for i := range a.Data {
		a.Data[i] += b.Data[i]
	}
}

// KVCache holds the keys and values of one attention layer for every position seen so far:
// Keys[p] and Values[p] are kvHeads*headDim wide.
type KVCache struct {
	Keys, Values [][]float64
}

// Len is the number of cached positions.
func (c *KVCache) Len() int { return len(c.Keys) }

// CausalAttention appends the rows of k and v (n×kvHeads*headDim, positions Len()..Len()+n-1)
// to the cache and returns softmax(q·kᵀ·scale)·v for the n query rows (n×heads*headDim), each
// query attending to every cached position up to and including its own. Query head h reads
// key/value head h/(heads/kvHeads): grouped-query attention; kvHeads == heads is plain
// multi-head attention.
func CausalAttention(c *KVCache, q, k, v Matrix, heads, kvHeads, headDim int, scale float64) Matrix {
	if heads%kvHeads != 0 || q.Cols != heads*headDim || k.Cols != kvHeads*headDim || v.Cols != kvHeads*headDim || q.Rows != k.Rows || k.Rows != v.Rows {
		panic(fmt.Sprintf("numeric.CausalAttention: q %dx%d k %dx%d v %dx%d heads %d kv %d dim %d",
			q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols, heads, kvHeads, headDim))
	}
	start := c.Len()
	for i := 0; i < k.Rows; i++ {
		c.Keys = append(c.Keys, append([]float64(nil), k.Row(i)...))
		c.Values = append(c.Values, append([]float64(nil), v.Row(i)...))
	}
	group := heads / kvHeads
	out := NewMatrix(q.Rows, q.Cols)
	scores := make([]float64, c.Len())
	for i := 0; i < q.Rows; i++ {
		last := start + i // inclusive: causal mask
		for h := 0; h < heads; h++ {
			qh := q.Row(i)[h*headDim : (h+1)*headDim]
			kvh := h / group
			maxScore := math.Inf(-1)
			for p := 0; p <= last; p++ {
				kh := c.Keys[p][kvh*headDim : (kvh+1)*headDim]
				s := 0.0
				for d := range qh {
					s += qh[d] * kh[d]
				}
				s *= scale
				scores[p] = s
				maxScore = math.Max(maxScore, s)
			}
			sum := 0.0
			for p := 0; p <= last; p++ {
				scores[p] = math.Exp(scores[p] - maxScore)
				sum += scores[p]
			}
			oh := out.Row(i)[h*headDim : (h+1)*headDim]
			for p := 0; p <= last; p++ {
				w := scores[p] / sum
				vh := c.Values[p][kvh*headDim : (kvh+1)*headDim]
				for d := range oh {
					oh[d] += w * vh[d]
				}
			}
		}
	}
	return out
}

// Argmax returns the index of the largest value; ties go to the lowest index, as torch.argmax
// does on CPU. It returns -1 for an empty slice.
func Argmax(xs []float64) int {
	best := -1
	for i, x := range xs {
		if best < 0 || x > xs[best] {
			best = i
		}
	}
	return best
}

// TopK returns the indices of the k largest values, largest first (ties: lower index first).
func TopK(xs []float64, k int) []int {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return xs[idx[a]] > xs[idx[b]] })
	if k > len(idx) {
		k = len(idx)
	}
	return idx[:k]
}

// Forward is one family's incremental forward pass over a single sequence: it appends ids to
// the sequence (its key/value caches) and returns the final hidden states (after the last
// norm) of the appended positions, or of the last one only when lastOnly is set.
type Forward func(ids []int32, lastOnly bool) (Matrix, error)

// Head maps final hidden states to logits (rows × vocab).
type Head func(hidden Matrix) Matrix

// Greedy runs greedy decoding for steps tokens after prompt (EOS is ignored, as
// generate(min_new_tokens=steps) does) and returns the chosen ids and, per step, the full
// logits row that chose it. Only the last position goes through the head: for small models
// the vocabulary projection dominates the cost.
func Greedy(fwd Forward, head Head, prompt []int32, steps int) ([]int32, [][]float64, error) {
	if len(prompt) == 0 {
		return nil, nil, fmt.Errorf("greedy: empty prompt; pass at least one token id")
	}
	ids := make([]int32, 0, steps)
	rows := make([][]float64, 0, steps)
	next := prompt
	for s := 0; s < steps; s++ {
		h, err := fwd(next, true)
		if err != nil {
			return ids, rows, err
		}
		row := head(h).Row(0)
		tok := int32(Argmax(row))
		ids = append(ids, tok)
		rows = append(rows, row)
		next = []int32{tok}
	}
	return ids, rows, nil
}

// headBlock is how many positions go through the head at once in EachLogits: enough for
// BLAS efficiency, few enough that a long sequence over a 151,936-token vocabulary does not
// hold every position's logits in memory (32 × 151,936 float64 is 39 MB).
const headBlock = 32

// EachLogits runs one forward pass over ids and calls fn with the logits of every position in
// order; row is reused after fn returns. It stops at fn's first error.
func EachLogits(fwd Forward, head Head, ids []int32, fn func(pos int, row []float64) error) error {
	if len(ids) == 0 {
		return fmt.Errorf("logits of an empty sequence; pass at least one token id")
	}
	h, err := fwd(ids, false)
	if err != nil {
		return err
	}
	for start := 0; start < h.Rows; start += headBlock {
		end := min(start+headBlock, h.Rows)
		block := Matrix{Rows: end - start, Cols: h.Cols, Data: h.Data[start*h.Cols : end*h.Cols]}
		l := head(block)
		for i := 0; i < l.Rows; i++ {
			if err := fn(start+i, l.Row(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// AllLogits is EachLogits collected into rows (len(ids) × vocab).
func AllLogits(fwd Forward, head Head, ids []int32) ([][]float64, error) {
	var rows [][]float64
	err := EachLogits(fwd, head, ids, func(_ int, row []float64) error {
		rows = append(rows, append([]float64(nil), row...))
		return nil
	})
	return rows, err
}

// Decoder gives a family's forward pass the public surface every reference shares (Logits,
// EachLogits, Greedy, GreedyLogits); a reference embeds it and supplies its own session and
// head, keeping every model rule in the family's own package.
type Decoder struct {
	// Name prefixes errors, e.g. "qwen reference".
	Name string
	// Session returns a fresh incremental forward pass (own key/value caches), so a
	// Decoder is safe for concurrent use.
	Session func() Forward
	// Head maps final hidden states to logits.
	Head Head
	// MaxPositions bounds prompt plus generated tokens (0: no bound).
	MaxPositions int
}

// Logits returns the full-vocabulary logits at every position of ids (len(ids) rows). For
// long sequences over a large vocabulary prefer EachLogits, which holds one block of rows.
func (d Decoder) Logits(ids []int32) ([][]float64, error) {
	rows, err := AllLogits(d.Session(), d.Head, ids)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.Name, err)
	}
	return rows, nil
}

// EachLogits calls fn with the logits of every position of ids, in order; row is reused
// after fn returns.
func (d Decoder) EachLogits(ids []int32, fn func(pos int, row []float64) error) error {
	return EachLogits(d.Session(), d.Head, ids, fn)
}

// Greedy returns the steps tokens greedy decoding chooses after ids, ignoring EOS.
func (d Decoder) Greedy(ids []int32, steps int) ([]int32, error) {
	out, _, err := d.GreedyLogits(ids, steps)
	return out, err
}

// GreedyLogits is Greedy that also returns, per step, the logits row that chose the token.
func (d Decoder) GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error) {
	// The last chosen token is never fed back, hence the −1.
	if d.MaxPositions > 0 && len(ids)+steps-1 > d.MaxPositions {
		return nil, nil, fmt.Errorf("%s: prompt of %d tokens plus %d steps exceeds the %d positions of the model", d.Name, len(ids), steps, d.MaxPositions)
	}
	return Greedy(d.Session(), d.Head, ids, steps)
}
