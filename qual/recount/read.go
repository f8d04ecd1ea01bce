package recount

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// clientRecord is one line of client_records.jsonl in the text layout: every time but
// start_unix_ns is monotonic nanoseconds since the request was sent.
type clientRecord struct {
	RequestID string `json:"request_id"`
	Phase     string `json:"phase"`
	Endpoint  string `json:"endpoint"`
	Stream    bool   `json:"stream"`

	StartUnixNs int64   `json:"start_unix_ns"`
	AckNs       int64   `json:"ack_ns"`
	EndNs       int64   `json:"end_ns"`
	ChunkNs     []int64 `json:"chunk_ns"`

	HTTPStatus int `json:"http_status"`
	Error      *struct {
		Code    int    `json:"code"`
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	Cancelled bool  `json:"cancelled"`
	CancelNs  int64 `json:"cancel_ns"`

	InputTokens        int    `json:"input_tokens"`
	InputTokensServer  int    `json:"input_tokens_server"`
	OutputTokensServer int    `json:"output_tokens_server"`
	OutputTokensClient int    `json:"output_tokens_client"`
	ResponseBytes      int64  `json:"response_bytes"`
	FinishReason       string `json:"finish_reason"`

	ScheduledNs int64 `json:"scheduled_ns"`
	LatenessNs  int64 `json:"lateness_ns"`
}

// serverRecord is what is read of one line of the server's records.
type serverRecord struct {
	RequestID     string `json:"request_id"`
	Route         string `json:"route"`
	Status        int    `json:"status"`
	Stream        bool   `json:"stream"`
	Warmup        bool   `json:"warmup"`
	HTTPLatencyNs int64  `json:"http_latency_ns"`
	TTFTNs        int64  `json:"ttft_ns"`
	QueueWaitNs   int64  `json:"queue_wait_ns"`
	TaskWallNs    int64  `json:"task_wall_ns"`
	TaskTTFTNs    int64  `json:"task_ttft_ns"`
	InputTokens   int    `json:"input_tokens"`
	OutputTokens  int    `json:"output_tokens"`
	FinishReason  string `json:"finish_reason"`
	OutputSHA256  string `json:"output_sha256"`
	OutputBytes   int64  `json:"output_bytes"`
	Image         *struct {
		Width       int     `json:"width"`
		Height      int     `json:"height"`
		Steps       int     `json:"steps"`
		Guidance    float64 `json:"guidance"`
		Seed        int64   `json:"seed"`
		PNGSHA256   string  `json:"png_sha256"`
		PNGBytes    int64   `json:"png_bytes"`
		PNGEncodeNs int64   `json:"png_encode_ns"`
	} `json:"image"`
	VisionNs     int64        `json:"vision_ns"`
	Vision       *visionCost  `json:"vision"`
	VisionImages []visionCost `json:"vision_images"`

	// has names the fields the line holds ("image.png_sha256" for the image's), so a field a
	// shortened copy of the records leaves out is not mistaken for a zero.
	has map[string]bool
}

// visionCost is one input image's share of a vision chat request's record.
type visionCost struct {
	ImageTokens  int   `json:"image_tokens"`
	PreprocessNs int64 `json:"preprocess_ns"`
}

// UnmarshalJSON reads the record and which fields it holds.
func (s *serverRecord) UnmarshalJSON(b []byte) error {
	type plain serverRecord
	if err := json.Unmarshal(b, (*plain)(s)); err != nil {
		return err
	}
	var top struct {
		Fields map[string]json.RawMessage
		Image  map[string]json.RawMessage `json:"image"`
	}
	if err := json.Unmarshal(b, &top.Fields); err != nil {
		return err
	}
	_ = json.Unmarshal(top.Fields["image"], &top.Image)
	s.has = map[string]bool{}
	for k := range top.Fields {
		s.has[k] = true
	}
	for k := range top.Image {
		s.has["image."+k] = true
	}
	return nil
}

// readJSONL decodes one T per non-blank line; a bad line fails naming the file and line.
func readJSONL[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileErr(path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 256<<20)
	var out []T
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return out, fmt.Errorf("verify: %s line %d: %w", path, line, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("verify: read %s: %w", path, err)
	}
	return out, nil
}

// summaryJSON is what is read of summary.json, in either layout.
type summaryJSON struct {
	// Image layout.
	Endpoint string          `json:"endpoint"`
	Points   json.RawMessage `json:"points"`

	// Text layout (image runs too, since they were moved into it: InputConfig says which).
	InputConfig struct {
		Endpoint struct {
			Type string `json:"type"`
		} `json:"endpoint"`
	} `json:"input_config"`
	SLOs []struct {
		Tag            string  `json:"tag"`
		Threshold      float64 `json:"threshold"`
		LargerIsBetter bool    `json:"larger_is_better"`
	} `json:"slos"`
	Cost *struct {
		FrontendCPUNs      int64   `json:"frontend_cpu_ns"`
		WorkerCPUNs        int64   `json:"worker_cpu_ns"`
		ClientCPUNs        int64   `json:"client_cpu_ns"`
		EngineTokensPerSec float64 `json:"engine_tokens_per_sec"`
	} `json:"serving_cost"`
	Sweep *struct {
		Parameter string `json:"parameter"`
	} `json:"sweep"`
	Profiling *phaseJSON `json:"profiling"`
	Warmup    *phaseJSON `json:"warmup"`
}

// phaseJSON is one phase of summary.json.
type phaseJSON struct {
	Requests *int                                  `json:"requests"`
	Metrics  map[string]map[string]json.RawMessage `json:"metrics"`
	Errors   []errorGroupJSON                      `json:"error_summary"`
	StartNs  *int64                                `json:"start_ns"`
	EndNs    *int64                                `json:"end_ns"`
}

type errorGroupJSON struct {
	Details struct {
		Code int    `json:"code"`
		Type string `json:"type"`
	} `json:"error_details"`
	Count int `json:"count"`
}

func readSummary(path string) (*summaryJSON, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fileErr(path, err)
	}
	var s summaryJSON
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("verify: %s: %w", path, err)
	}
	return &s, nil
}

// metricNumbers reads a metric object's numeric fields ({"unit": ..., "avg": ..., ...}).
func metricNumbers(obj map[string]json.RawMessage) (unit string, vals map[string]float64) {
	vals = map[string]float64{}
	for k, raw := range obj {
		if k == "unit" {
			_ = json.Unmarshal(raw, &unit)
			continue
		}
		var v float64
		if json.Unmarshal(raw, &v) == nil {
			vals[k] = v
		}
	}
	return unit, vals
}

// exportLine is one line of profile_export.jsonl.
type exportLine struct {
	Metadata struct {
		XRequestID     string `json:"x_request_id"`
		RequestStartNs int64  `json:"request_start_ns"`
		RequestAckNs   int64  `json:"request_ack_ns"`
		RequestEndNs   int64  `json:"request_end_ns"`
		BenchmarkPhase string `json:"benchmark_phase"`
		WasCancelled   bool   `json:"was_cancelled"`
	} `json:"metadata"`
	Metrics map[string]struct {
		Value json.RawMessage `json:"value"`
		Unit  string          `json:"unit"`
	} `json:"metrics"`
	Error *struct {
		Code int    `json:"code"`
		Type string `json:"type"`
	} `json:"error"`
}

// values reads a metric's value: one number, or a list.
func exportValue(raw json.RawMessage) (v float64, list []float64, isList bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		err = json.Unmarshal(raw, &list)
		return 0, list, true, err
	}
	err = json.Unmarshal(raw, &v)
	return v, nil, false, err
}

// aiperfJSON reads profile_export_aiperf.json of the text layout: metric objects by tag, and
// the error summary; other top-level fields are not figures.
func readAIPerfJSON(path string) (metrics map[string]map[string]json.RawMessage, errs []errorGroupJSON, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fileErr(path, err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, nil, fmt.Errorf("verify: %s: %w", path, err)
	}
	metrics = map[string]map[string]json.RawMessage{}
	for k, raw := range top {
		switch k {
		case "error_summary":
			if err := json.Unmarshal(raw, &errs); err != nil {
				return nil, nil, fmt.Errorf("verify: %s error_summary: %w", path, err)
			}
			continue
		case "input_config", "was_cancelled", "start_time", "end_time":
			continue
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			continue
		}
		if _, ok := obj["unit"]; ok {
			metrics[k] = obj
		}
	}
	return metrics, errs, nil
}

// csvCell is one number of profile_export_aiperf.csv with how many decimals it was written
// with (its precision).
type csvCell struct {
	v        float64
	decimals int
	text     string
}

// readCSV reads profile_export_aiperf.csv: the statistics rows (label → column → cell) and
// the Metric,Value rows (label → cell).
func readCSV(path string) (dists map[string]map[string]csvCell, scalars map[string]csvCell, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fileErr(path, err)
	}
	dists, scalars = map[string]map[string]csvCell{}, map[string]csvCell{}
	sections := strings.SplitN(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n", 2)
	parse := func(s string) ([][]string, error) {
		r := csv.NewReader(strings.NewReader(s))
		r.FieldsPerRecord = -1
		var rows [][]string
		for {
			row, err := r.Read()
			if err == io.EOF {
				return rows, nil
			}
			if err != nil {
				return rows, err
			}
			rows = append(rows, row)
		}
	}
	cell := func(s string) (csvCell, error) {
		v, err := strconv.ParseFloat(s, 64)
		d := 0
		if i := strings.IndexByte(s, '.'); i >= 0 {
			d = len(s) - i - 1
		}
		return csvCell{v: v, decimals: d, text: s}, err
	}
	rows, err := parse(sections[0])
	if err != nil || len(rows) == 0 {
		return nil, nil, fmt.Errorf("verify: %s: the statistics section is not CSV with a header row: %v", path, err)
	}
	head := rows[0]
	for _, row := range rows[1:] {
		m := map[string]csvCell{}
		for i := 1; i < len(row) && i < len(head); i++ {
			c, err := cell(row[i])
			if err != nil {
				return nil, nil, fmt.Errorf("verify: %s: %q column %s: %w", path, row[0], head[i], err)
			}
			m[head[i]] = c
		}
		dists[row[0]] = m
	}
	if len(sections) == 2 {
		rows, err := parse(sections[1])
		if err != nil {
			return nil, nil, fmt.Errorf("verify: %s: the Metric,Value section: %w", path, err)
		}
		for i, row := range rows {
			if i == 0 || len(row) < 2 {
				continue
			}
			c, err := cell(row[1])
			if err != nil {
				return nil, nil, fmt.Errorf("verify: %s: %q: %w", path, row[0], err)
			}
			scalars[row[0]] = c
		}
	}
	return dists, scalars, nil
}
