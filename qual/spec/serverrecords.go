package spec

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/modelqual/modelqual/qual/records"
)

// newRequestID is a request ID unique to this run, prefixed with what the gate is doing, so a
// gate finds its own requests' records in the server's records file.
func newRequestID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// recordWait bounds how long a gate waits for the server to write a finished request's
// record (it is written after the response ends, so it may trail the client by a moment).
const recordWait = 10 * time.Second

// waitRecords reads the server's records file until every id has at least one record, or
// recordWait passes, and returns each id's records (all of them, so duplicates show). The
// error names the ids still without a record.
func waitRecords(ctx context.Context, path string, ids []string) (map[string][]records.Server, error) {
	deadline := time.Now().Add(recordWait)
	for {
		all, err := records.ReadServer(path)
		if err != nil {
			return nil, fmt.Errorf("read server records %s: %w", path, err)
		}
		byID := map[string][]records.Server{}
		for _, r := range all {
			byID[r.RequestID] = append(byID[r.RequestID], r)
		}
		var missing []string
		for _, id := range ids {
			if len(byID[id]) == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return byID, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return byID, fmt.Errorf("server records %s: %d of %d requests have no record %s after waiting %s: %s",
				path, len(missing), len(ids), "(every request must leave exactly one)", recordWait, strings.Join(missing, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
