package qwen3moe

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelqual/modelqual/qual/spec"
)

// RoutedTokensMetric is the server's per-layer, per-expert routing counter (GET /metrics).
const RoutedTokensMetric = "qual_server_moe_routed_tokens_total"

// Router is what the routing gate needs from the family reference: how many of a prompt's
// tokens each sparse layer sends to each expert (counts[layer][expert]; nil rows for dense
// layers).
type Router interface {
	ExpertCounts(ids []int32) ([][]uint64, error)
}

// RoutingPrompt is one prompt of the routing gate, as token ids.
type RoutingPrompt struct {
	Name string
	IDs  []int32
}

// RoutingInput is the input of CheckRouting.
type RoutingInput struct {
	// API reaches the served model; its /metrics is read before and after each prompt, so no
	// other request may run on the server meanwhile (the spec is Serial).
	API *spec.API
	// Reference routes the same prompts.
	Reference Router
	// Prompts are sent one by one as token-id completions of one token, so the server routes
	// exactly the prompt's tokens (the first token comes from the prefill's logits).
	Prompts []RoutingPrompt
	// Wait bounds how long the counters may take to show a request's routing (default 5 s).
	Wait time.Duration
}

// CheckRouting is the routing gate: for every prompt, the tokens the served model's router
// sent to each expert of each layer (the change of the server's routing counter over the
// request) must equal those of the family reference, expert by expert. A router that picks
// other experts (a wrong softmax, top-k or expert order, a misloaded router matrix) fails it
// even where the outputs happen to stay close. It returns one line per disagreeing prompt.
func CheckRouting(ctx context.Context, in RoutingInput) error {
	switch {
	case in.API == nil:
		return fmt.Errorf("qwen3moe.CheckRouting: RoutingInput.API is nil")
	case in.Reference == nil:
		return fmt.Errorf("qwen3moe.CheckRouting: RoutingInput.Reference is nil")
	case len(in.Prompts) == 0:
		return fmt.Errorf("qwen3moe.CheckRouting: RoutingInput.Prompts is empty")
	}
	wait := in.Wait
	if wait <= 0 {
		wait = 5 * time.Second
	}
	var problems []string
	pass := 0
	for _, p := range in.Prompts {
		want, err := in.Reference.ExpertCounts(p.IDs)
		if err != nil {
			return fmt.Errorf("routing gate: reference on %q: %w", p.Name, err)
		}
		var total uint64
		for _, row := range want {
			for _, n := range row {
				total += n
			}
		}
		before, err := ScrapeRouting(ctx, in.API)
		if err != nil {
			return fmt.Errorf("routing gate: %w", err)
		}
		if _, err := in.API.Complete(ctx, "/v1/completions", map[string]any{"prompt": p.IDs, "max_tokens": 1, "temperature": 0}); err != nil {
			return fmt.Errorf("routing gate: prompt %q: %w", p.Name, err)
		}
		var got map[[2]int]uint64
		deadline := time.Now().Add(wait)
		for {
			after, err := ScrapeRouting(ctx, in.API)
			if err != nil {
				return fmt.Errorf("routing gate: %w", err)
			}
			got = map[[2]int]uint64{}
			var sum uint64
			for k, v := range after {
				if d := v - before[k]; d > 0 {
					got[k] = d
					sum += d
				}
			}
			if sum >= total || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if diff := routingDiff(want, got); diff != "" {
			problems = append(problems, fmt.Sprintf("prompt %q (%d tokens): %s", p.Name, len(p.IDs), diff))
			continue
		}
		pass++
	}
	if len(problems) > 0 {
		return fmt.Errorf("routing gate: %d of %d prompts route as the reference does:\n  %s", pass, len(in.Prompts), strings.Join(problems, "\n  "))
	}
	return nil
}

// routingDiff names the (layer, expert) counts that differ, the worst first; "" when equal.
func routingDiff(want [][]uint64, got map[[2]int]uint64) string {
	type d struct {
		layer, expert int
		want, got     uint64
	}
	var ds []d
	seen := map[[2]int]bool{}
	for l, row := range want {
		for e, n := range row {
			seen[[2]int{l, e}] = true
			if g := got[[2]int{l, e}]; g != n {
				ds = append(ds, d{l, e, n, g})
			}
		}
	}
	for k, g := range got {
		if !seen[k] {
			ds = append(ds, d{k[0], k[1], 0, g})
		}
	}
	if len(ds) == 0 {
		return ""
	}
	gap := func(x d) uint64 { return max(x.want, x.got) - min(x.want, x.got) }
	sort.Slice(ds, func(i, j int) bool {
		if gap(ds[i]) != gap(ds[j]) {
			return gap(ds[i]) > gap(ds[j])
		}
		return ds[i].layer*1000+ds[i].expert < ds[j].layer*1000+ds[j].expert
	})
	var parts []string
	for i, x := range ds {
		if i == 6 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ds)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("layer %d expert %d served %d tokens, the reference routes %d", x.layer, x.expert, x.got, x.want))
	}
	return fmt.Sprintf("%d (layer, expert) counts differ: %s", len(ds), strings.Join(parts, "; "))
}

// ScrapeRouting reads the server's routing counter: tokens by (layer, expert).
func ScrapeRouting(ctx context.Context, api *spec.API) (map[[2]int]uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.BaseURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := api.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape /metrics: status %d", resp.StatusCode)
	}
	return ParseRouting(bufio.NewScanner(resp.Body))
}

// ParseRouting reads RoutedTokensMetric's samples from Prometheus text exposition lines such as
// qual_server_moe_routed_tokens_total{expert="3",layer="0"} 17.
func ParseRouting(sc *bufio.Scanner) (map[[2]int]uint64, error) {
	out := map[[2]int]uint64{}
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, RoutedTokensMetric+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("/metrics: malformed sample %q", line)
		}
		layer, expert := -1, -1
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.Atoi(strings.Trim(v, `"`))
			if err != nil {
				return nil, fmt.Errorf("/metrics: sample %q: label %s is not a number", line, k)
			}
			switch k {
			case "layer":
				layer = n
			case "expert":
				expert = n
			}
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil || layer < 0 || expert < 0 {
			return nil, fmt.Errorf("/metrics: malformed sample %q", line)
		}
		out[[2]int{layer, expert}] = uint64(f)
	}
	return out, sc.Err()
}
