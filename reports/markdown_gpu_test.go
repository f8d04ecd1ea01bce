package reports

import (
	"encoding/json"
	"strings"
	"testing"
)

// The GPU blob below uses the keys qual/gpu's Telemetry writes; summary.md must show the
// memory high-water, utilisation, power, energy and joules per output token from it.
func TestMarkdownShowsGPUTelemetry(t *testing.T) {
	blob := json.RawMessage(`{"available":true,"interval_ns":100000000,"energy_j":96,"joules_per_output_token":0.375,
		"devices":[{"index":0,"uuid":"GPU-1234","gpu_utilization_avg_pct":37.5,"gpu_utilization_max_pct":90,
		"memory_used_bytes":1048576,"memory_high_water_bytes":18114150400,"power_avg_w":184.25,"power_max_w":301,"energy_j":96,"samples":12}]}`)
	md := Markdown(&Summary{Run: Run{Name: "gpu", GPUTelemetry: blob}})
	// 18114150400 B / 2^20 = 17275.00 MiB.
	for _, want := range []string{"| 0 GPU-1234 | 17275.00 | 37.50 / 90.00 | 184.25 / 301.00 | 96.00 |", "0.375 J per output token"} {
		if !strings.Contains(md, want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}

	// A short window: energy integrated from the power samples, said so, and the sampler's note.
	blob = json.RawMessage(`{"available":true,"interval_ns":100000000,"energy_j":9,"joules_per_output_token":0.00325,
		"window_s":0.4,"note":"the window (0.40 s) is shorter than NVML's utilization period (up to 1s): utilization partly describes the time before it",
		"devices":[{"index":1,"uuid":"GPU-5678","memory_high_water_bytes":1048576,"power_avg_w":90,"power_max_w":100,"energy_j":9,"energy_source":"power_samples","power_reading":"usage","samples":5}]}`)
	md = Markdown(&Summary{Run: Run{Name: "short", GPUTelemetry: blob}})
	for _, want := range []string{"| 9.00 (from power samples) |", "GPU energy 9.00 J, 0.00325 J per output token, over 0.40 s.", "Note: the window (0.40 s) is shorter", "Power is nvmlDeviceGetPowerUsage's reading"} {
		if !strings.Contains(md, want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}

	md = Markdown(&Summary{Run: Run{Name: "cpu", GPUTelemetry: json.RawMessage(`{"available":false,"reason":"NVML: libnvidia-ml.so not found"}`)}})
	if !strings.Contains(md, "GPU telemetry unavailable: NVML: libnvidia-ml.so not found.") {
		t.Errorf("summary.md does not say why GPU telemetry is missing:\n%s", md)
	}
	if md := Markdown(&Summary{Run: Run{Name: "none"}}); strings.Contains(md, "GPU") {
		t.Errorf("summary.md mentions GPUs for a run that recorded no telemetry:\n%s", md)
	}
}
