package gpu

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// CardsEntry names the Ginkgo report entry in which each process of a GPU run leaves its
// []CardUsage (qual/spec writes it when the process's server stops; qual qualify merges them).
const CardsEntry = "gpu cards"

// CardUsage is what one process read of one unit it held over its server's life: the record
// that shows, per card, what a parallel run cost.
type CardUsage struct {
	Family  string `json:"family,omitempty"`
	Process int    `json:"process"`
	// UUID is the unit's (a GPU's or a MIG instance's), Card the physical GPU's.
	UUID  string `json:"uuid"`
	Card  string `json:"card_uuid"`
	Index int    `json:"index"`
	Name  string `json:"name,omitempty"`
	MIG   bool   `json:"mig,omitempty"`
	// The sampler's figures (DeviceStats) over WindowS seconds.
	WindowS              float64 `json:"window_s"`
	EnergyJ              float64 `json:"energy_j"`
	EnergySource         string  `json:"energy_source,omitempty"`
	MemoryHighWaterBytes uint64  `json:"memory_high_water_bytes"`
	MemoryBytes          uint64  `json:"memory_bytes,omitempty"`
	UtilizationAvg       float64 `json:"gpu_utilization_avg_pct"`
	PowerAvgW            float64 `json:"power_avg_w"`
	Samples              int     `json:"samples"`
	// Reason is why there are no readings (telemetry unavailable), else "".
	Reason string `json:"reason,omitempty"`
}

// Usage pairs a process's units with its sampler's telemetry (one DeviceStats per unit, in
// order): one CardUsage per unit. Without telemetry every unit gets the reason.
func Usage(family string, process int, units []Device, tel Telemetry) []CardUsage {
	out := make([]CardUsage, len(units))
	for i, u := range units {
		c := CardUsage{Family: family, Process: process, UUID: u.UUID, Card: u.Card(), Index: u.Index,
			Name: u.Name, MIG: u.Parent != "", MemoryBytes: u.MemoryBytes}
		if !tel.Available || i >= len(tel.Devices) {
			c.Reason = tel.Reason
			if c.Reason == "" {
				c.Reason = "no readings for this unit"
			}
		} else {
			st := tel.Devices[i]
			c.WindowS, c.EnergyJ, c.EnergySource = tel.WindowS, st.EnergyJ, st.EnergySource
			c.MemoryHighWaterBytes, c.UtilizationAvg, c.PowerAvgW, c.Samples = st.MemoryHighWaterBytes, st.UtilizationAvg, st.PowerAvgW, st.Samples
		}
		out[i] = c
	}
	return out
}

// CardShare is one physical GPU's part of a campaign (MergeCards).
type CardShare struct {
	Card  string `json:"card_uuid"`
	Index int    `json:"index"`
	Name  string `json:"name,omitempty"`
	// Users are the processes that held it, "family pN" (N the Ginkgo process), in order.
	Users []string `json:"users,omitempty"`
	// HeldS sums its users' windows; HeldShare is HeldS over the campaign's wall time (above
	// 1 only where MIG instances of the card were held side by side).
	HeldS     float64 `json:"held_s"`
	HeldShare float64 `json:"held_share,omitempty"`
	// EnergyJ sums its users' energy; EnergyShare is its part of every card's energy.
	EnergyJ     float64 `json:"energy_j"`
	EnergyShare float64 `json:"energy_share"`
	// MemoryHighWaterBytes is the largest high-water mark any user saw (per MIG instance on a
	// MIG card).
	MemoryHighWaterBytes uint64 `json:"memory_high_water_bytes"`
	MIG                  bool   `json:"mig,omitempty"`
	// Note says what to keep in mind: idle, no readings, MIG's missing energy.
	Note string `json:"note,omitempty"`
}

// MergeCards joins the CardUsage records of a campaign (every family, every process) into one
// row per physical GPU of cards (the runner's units, so that a card nobody used shows as idle)
// and of any card only the records name, in NVML order. wallS is the campaign's wall time in
// seconds (0: HeldShare is left out).
func MergeCards(cards []Device, usage []CardUsage, wallS float64) []CardShare {
	byCard := map[string]*CardShare{}
	var order []string
	add := func(card string, index int, name string, mig bool) *CardShare {
		if c, ok := byCard[card]; ok {
			return c
		}
		c := &CardShare{Card: card, Index: index, Name: name, MIG: mig}
		byCard[card] = c
		order = append(order, card)
		return c
	}
	for _, u := range cards {
		add(u.Card(), u.Index, u.Name, u.Parent != "")
	}
	total := 0.0
	reasons := map[string][]string{}
	for _, u := range usage {
		c := add(u.Card, u.Index, u.Name, u.MIG)
		user := fmt.Sprintf("%s p%d", u.Family, u.Process)
		if u.Family == "" {
			user = fmt.Sprintf("p%d", u.Process)
		}
		if !containsString(c.Users, user) {
			c.Users = append(c.Users, user)
		}
		if u.Reason != "" {
			reasons[u.Card] = append(reasons[u.Card], u.Reason)
			continue
		}
		c.HeldS += u.WindowS
		c.EnergyJ += u.EnergyJ
		total += u.EnergyJ
		c.MemoryHighWaterBytes = max(c.MemoryHighWaterBytes, u.MemoryHighWaterBytes)
	}
	out := make([]CardShare, 0, len(order))
	for _, k := range order {
		c := byCard[k]
		if total > 0 {
			c.EnergyShare = c.EnergyJ / total
		}
		if wallS > 0 {
			c.HeldShare = c.HeldS / wallS
		}
		var notes []string
		switch {
		case len(c.Users) == 0:
			notes = append(notes, "idle: no server ran on it")
		case len(reasons[k]) > 0:
			notes = append(notes, "no readings: "+reasons[k][0])
		}
		if c.MIG && len(c.Users) > 0 {
			notes = append(notes, "MIG: NVML reads power and energy per GPU, not per instance, so none is counted")
		}
		c.Note = strings.Join(notes, "; ")
		out = append(out, *c)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

func containsString(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// WriteCards prints shares as a table, one row per card, then the total energy.
func WriteCards(w io.Writer, shares []CardShare) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tCard\tUsed by\tHeld (s)\tHeld share\tEnergy (J)\tEnergy share\tMemory high-water (MiB)\tNote")
	total := 0.0
	for _, c := range shares {
		held := "-"
		if c.HeldShare > 0 {
			held = fmt.Sprintf("%.0f%%", 100*c.HeldShare)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.1f\t%s\t%.1f\t%.1f%%\t%.0f\t%s\n", c.Index, c.Card, orDash(strings.Join(c.Users, ", ")),
			c.HeldS, held, c.EnergyJ, 100*c.EnergyShare, float64(c.MemoryHighWaterBytes)/(1<<20), c.Note)
		total += c.EnergyJ
	}
	tw.Flush()
	fmt.Fprintf(w, "Total GPU energy %.1f J over %d card(s).\n", total, len(shares))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
