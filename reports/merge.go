package reports

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
)

// Merge joins runs made on several machines (shards of one qualification) into one run: the
// per-request records are concatenated, each tagged with its shard ID in
// metadata.mq_shard_id, and every statistic is recomputed from them by Summarize. Each
// shard's own window (first start to last response) is kept in the summary's
// shard_windows with its own throughputs, and the merged benchmark duration is the length of
// the union of those windows: shards that ran at the same time share it (throughputs are
// theirs together), shards that ran one after another add up, and the idle gap between them
// (shard_gap_sec, which summary.md states) is never counted as measured time.
//
// Runs must share their SLOs (goodput would mean different things otherwise). Serving-cost
// CPU times, engine rates and engine steps are summed; environment, provenance and GPU telemetry become an
// object keyed by shard ID; input_config and the sweep point are kept when all shards agree.
func Merge(runs []*Run, shardIDs []string) (*Run, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("merge: no runs given")
	}
	if len(shardIDs) != len(runs) {
		return nil, fmt.Errorf("merge: %d runs but %d shard IDs", len(runs), len(shardIDs))
	}
	seen := map[string]bool{}
	for _, id := range shardIDs {
		if seen[id] {
			return nil, fmt.Errorf("merge: shard ID %q given twice; name each run directory uniquely", id)
		}
		seen[id] = true
	}
	out := &Run{Name: "merged", SLOs: runs[0].SLOs, Sweep: runs[0].Sweep, InputConfig: runs[0].InputConfig, Shards: shardIDs}
	env, prov, gpu := map[string]json.RawMessage{}, map[string]json.RawMessage{}, map[string]json.RawMessage{}
	var cost ServingCost
	haveCost := false
	for i, r := range runs {
		id := shardIDs[i]
		if !reflect.DeepEqual(r.SLOs, runs[0].SLOs) {
			return nil, fmt.Errorf("merge: shard %q has SLOs %+v but shard %q has %+v; merge only runs profiled with the same --slo",
				id, r.SLOs, shardIDs[0], runs[0].SLOs)
		}
		if !reflect.DeepEqual(r.Sweep, runs[0].Sweep) {
			out.Sweep = nil
		}
		if !jsonEqual(r.InputConfig, runs[0].InputConfig) {
			out.InputConfig = nil
		}
		for _, rec := range r.Records {
			rec.Metadata.ShardID = id
			out.Records = append(out.Records, rec)
		}
		if r.Cost != nil {
			haveCost = true
			cost.FrontendCPUNs += r.Cost.FrontendCPUNs
			cost.WorkerCPUNs += r.Cost.WorkerCPUNs
			cost.ClientCPUNs += r.Cost.ClientCPUNs
			cost.EngineTokensPerSec += r.Cost.EngineTokensPerSec
		}
		for _, n := range r.Notes { // a shard's caveat holds for the merged figures too
			if !slices.Contains(out.Notes, n) {
				out.Notes = append(out.Notes, n)
			}
		}
		addBlob(env, id, r.Environment)
		addBlob(prov, id, r.Provenance)
		addBlob(gpu, id, r.GPUTelemetry)
		if r.EngineSteps != nil {
			if out.EngineSteps == nil {
				out.EngineSteps = &EngineSteps{}
			}
			out.EngineSteps.Add(r.EngineSteps)
		}
		if !r.StartTime.IsZero() && (out.StartTime.IsZero() || r.StartTime.Before(out.StartTime)) {
			out.StartTime = r.StartTime
		}
		if r.EndTime.After(out.EndTime) {
			out.EndTime = r.EndTime
		}
	}
	if haveCost {
		out.Cost = &cost
	}
	out.Environment, out.Provenance, out.GPUTelemetry = blobObject(env), blobObject(prov), blobObject(gpu)
	return out, nil
}

func jsonEqual(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

func addBlob(m map[string]json.RawMessage, id string, b json.RawMessage) {
	if len(bytes.TrimSpace(b)) > 0 {
		m[id] = b
	}
}

func blobObject(m map[string]json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}

// junitSuite is a <testsuite> kept verbatim apart from its attributes.
type junitSuite struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Inner   []byte     `xml:",innerxml"`
}

// junitRoot is a <testsuites> document (Ginkgo's JUnit report) or a lone <testsuite>.
type junitRoot struct {
	XMLName xml.Name
	Attrs   []xml.Attr   `xml:",any,attr"`
	Suites  []junitSuite `xml:"testsuite"`
	Inner   []byte       `xml:",innerxml"`
}

// junitCounters are the attributes summed over merged suites.
var junitCounters = []string{"tests", "disabled", "skipped", "errors", "failures"}

// MergeJUnit merges JUnit XML files (such as Ginkgo's --junit-report from several runners)
// into one <testsuites> document at out, keeping every <testsuite> verbatim and summing the
// root's tests, disabled, skipped, errors, failures and time.
func MergeJUnit(out string, inputs []string) error {
	sums := map[string]int{}
	totalTime := 0.0
	var suites []junitSuite
	for _, in := range inputs {
		b, err := os.ReadFile(in)
		if err != nil {
			return fmt.Errorf("merge junit: %w", err)
		}
		var root junitRoot
		if err := xml.Unmarshal(b, &root); err != nil {
			return fmt.Errorf("merge junit: %s is not JUnit XML: %w", in, err)
		}
		switch root.XMLName.Local {
		case "testsuites":
			suites = append(suites, root.Suites...)
		case "testsuite":
			suites = append(suites, junitSuite{XMLName: root.XMLName, Attrs: root.Attrs, Inner: root.Inner})
		default:
			return fmt.Errorf("merge junit: %s has root <%s>, want <testsuites> or <testsuite>", in, root.XMLName.Local)
		}
	}
	for _, s := range suites {
		for _, a := range s.Attrs {
			switch a.Name.Local {
			case "time":
				f, _ := strconv.ParseFloat(a.Value, 64)
				totalTime += f
			default:
				for _, c := range junitCounters {
					if a.Name.Local == c {
						n, _ := strconv.Atoi(a.Value)
						sums[c] += n
					}
				}
			}
		}
	}
	root := struct {
		XMLName xml.Name     `xml:"testsuites"`
		Attrs   []xml.Attr   `xml:",any,attr"`
		Suites  []junitSuite `xml:"testsuite"`
	}{Suites: suites}
	for _, c := range junitCounters {
		root.Attrs = append(root.Attrs, xml.Attr{Name: xml.Name{Local: c}, Value: strconv.Itoa(sums[c])})
	}
	root.Attrs = append(root.Attrs, xml.Attr{Name: xml.Name{Local: "time"}, Value: strconv.FormatFloat(totalTime, 'f', -1, 64)})
	b, err := xml.MarshalIndent(root, "", "  ")
	if err != nil {
		return fmt.Errorf("merge junit: %w", err)
	}
	return os.WriteFile(out, append([]byte(xml.Header), append(b, '\n')...), 0o644)
}
