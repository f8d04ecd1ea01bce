package load

import (
	"context"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/modelqual/modelqual/reports"
)

// The engine-step histograms qual-server exports (server/metrics.go), labelled kind="prefill"
// or kind="decode".
const (
	stepSecondsMetric = "qual_server_engine_step_duration_seconds"
	stepTokensMetric  = "qual_server_engine_step_tokens"
	// routedMetric: a mixture of experts' tokens per (layer, expert).
	routedMetric = "qual_server_moe_routed_tokens_total"
)

// readEngineSteps reads the server's engine-step histograms from baseURL/metrics: the totals so
// far, per kind. ok is false when the server has none (another server, an older qual-server,
// or /metrics not answering within two seconds): the run then has no engine steps, which is
// not an error.
func readEngineSteps(ctx context.Context, baseURL string) (reports.EngineSteps, bool) {
	var es reports.EngineSteps
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/metrics", nil)
	if err != nil {
		return es, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return es, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return es, false
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil || fams[stepSecondsMetric] == nil || fams[stepTokensMetric] == nil {
		return es, false
	}
	kinds := map[string]*reports.StepStats{"prefill": &es.Prefill, "decode": &es.Decode}
	for _, m := range fams[stepSecondsMetric].GetMetric() {
		if st := kinds[label(m, "kind")]; st != nil {
			st.Steps = float64(m.GetHistogram().GetSampleCount())
			st.Seconds = m.GetHistogram().GetSampleSum()
		}
	}
	for _, m := range fams[stepTokensMetric].GetMetric() {
		if st := kinds[label(m, "kind")]; st != nil {
			st.Tokens = m.GetHistogram().GetSampleSum()
		}
	}
	for _, m := range fams[routedMetric].GetMetric() {
		l, errL := strconv.Atoi(label(m, "layer"))
		e, errE := strconv.Atoi(label(m, "expert"))
		if errL != nil || errE != nil || l < 0 || e < 0 || l > 1<<12 || e > 1<<16 {
			continue
		}
		for len(es.Experts) <= l {
			es.Experts = append(es.Experts, nil)
		}
		for len(es.Experts[l]) <= e {
			es.Experts[l] = append(es.Experts[l], 0)
		}
		es.Experts[l][e] = m.GetCounter().GetValue()
	}
	return es, true
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
