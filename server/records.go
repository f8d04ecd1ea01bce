package server

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/modelqual/modelqual/server/record"
)

// Record is one request's line in the --records JSONL file; the schema lives in package
// record so the harness reads exactly what the server writes.
type Record = record.Record

// recordWriter appends records to a file, one line each, flushed per record so that a killed
// frontend loses at most the line being written.
type recordWriter struct {
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	n    int
	drop bool // fault server.drop_record: skip every 5th record
	err  error
}

func openRecords(path string, drop bool) (*recordWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open records file %s: %w; pass a writable --records path", path, err)
	}
	return &recordWriter{f: f, w: bufio.NewWriterSize(f, 64<<10), drop: drop}, nil
}

func (rw *recordWriter) write(r *Record) {
	if rw == nil {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		return // Record has only plain fields
	}
	line = append(line, '\n')
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.n++
	if rw.drop && rw.n%5 == 0 {
		return
	}
	if _, err := rw.w.Write(line); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.w.Flush(); err != nil && rw.err == nil {
		rw.err = err
	}
}

func (rw *recordWriter) close() error {
	if rw == nil {
		return nil
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if err := rw.w.Flush(); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.f.Sync(); err != nil && rw.err == nil {
		rw.err = err
	}
	if err := rw.f.Close(); err != nil && rw.err == nil {
		rw.err = err
	}
	return rw.err
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
