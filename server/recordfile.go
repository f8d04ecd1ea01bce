package server

// The --records file: one JSONL line per request, in the schema of package record (the
// harness reads the same type back).

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelqual/modelqual/server/record"
)

// Record is one request's line in the --records JSONL file; the schema lives in package
// record so the harness reads exactly what the server writes.
type Record = record.Record

// Headers that place a request in a multi-turn conversation: X-Correlation-Id is the one
// AIPerf sends with every turn of a session (its x_correlation_id), X-Turn-Index the turn
// (0-based), as qual's load generator sends them (qual/client.HeaderSession, HeaderTurn).
const (
	headerSession = "X-Correlation-Id"
	headerTurn    = "X-Turn-Index"
)

// sessionOf reads a request's session and turn for its record. A session ID that is not safe
// to record (validRequestID's rule) or a turn that is not a small non-negative integer is left
// out rather than refused: they describe the request, they do not change its answer.
func sessionOf(h http.Header) (id string, turn int) {
	id = h.Get(headerSession)
	if !validRequestID(id) {
		return "", 0
	}
	if t, err := strconv.Atoi(h.Get(headerTurn)); err == nil && t >= 0 && t < 1<<20 {
		turn = t
	}
	return id, turn
}

// recordWriter appends records to a file, one line each, flushed per record so that a killed
// frontend loses at most the line being written. A write that fails is counted
// (qual_server_record_write_errors_total) and logged, and from then on the server refuses
// requests with 500 and /health reports it: a qualification run whose records are being lost
// must not look healthy.
type recordWriter struct {
	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	n      int
	drop   bool // fault server.drop_record: skip every 5th record
	err    error
	failed atomic.Bool
	errs   prometheus.Counter
	size   int64 // bytes of complete records in the file
}

// Filesystems whose files accept an open for writing but no record (statfs f_type values).
var pseudoFS = map[int64]string{0x9fa0: "procfs", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x27e0eb: "cgroupfs", 0x63677270: "cgroup2fs"}

func openRecords(path string, drop bool, errs prometheus.Counter) (*recordWriter, error) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("--records %s is not a regular file (%v); pass a regular file or a new path", path, fi.Mode().Type())
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open records file %s: %w; pass a writable --records path", path, err)
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err == nil {
		if name, bad := pseudoFS[int64(st.Type)]; bad {
			f.Close()
			return nil, fmt.Errorf("--records %s is on %s, which stores no records; pass a path on a real filesystem", path, name)
		}
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("--records %s is not a regular file; pass a regular file or a new path", path)
	}
	// Every record line is flushed whole; the file ends with a complete line (or is empty).
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat records file %s: %w", path, err)
	}
	return &recordWriter{f: f, w: bufio.NewWriterSize(f, 64<<10), drop: drop, errs: errs, size: fi.Size()}, nil
}

// write appends r; its error says the record is lost (counted and logged here).
func (rw *recordWriter) write(r *Record) error {
	if rw == nil {
		return nil
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err // Record has only plain fields
	}
	line = append(line, '\n')
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.n++
	if rw.drop && rw.n%5 == 0 {
		return nil
	}
	_, err = rw.w.Write(line)
	if err == nil {
		err = rw.w.Flush()
	}
	if err != nil {
		rw.errs.Inc()
		if rw.err == nil {
			rw.err = err
			log.Printf("records: writing %s failed: %v; every request is refused with 500 from now on", rw.f.Name(), err)
		}
		rw.failed.Store(true)
		// A partly written line would break every reader of the file: cut it off. A
		// bufio.Writer keeps its first error forever; a new one lets a later write (space
		// freed) be tried, and counted, again.
		_ = rw.f.Truncate(rw.size)
		rw.w = bufio.NewWriterSize(rw.f, 64<<10)
		return err
	}
	rw.size += int64(len(line))
	return nil
}

// failure is the records file's first write error once one happened.
func (rw *recordWriter) failure() error {
	if rw == nil || !rw.failed.Load() {
		return nil
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.err
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
