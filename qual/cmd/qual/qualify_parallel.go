package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/onsi/ginkgo/v2/types"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/server/envconfig"
)

// campaignPlan is how qual qualify --parallel N runs a campaign: Slots families side by side,
// each slot with its own GPUs (on a GPU run) that no other slot holds.
type campaignPlan struct {
	// GPURun says whether the campaign runs gpu specs (the label filter selects them, or
	// MODELQUAL_GPU=1); only then are GPUs placed.
	GPURun bool
	// Units are the GPUs the campaign may use (MODELQUAL_GPUS over the inventory); Slots one
	// GPU set per family run side by side (nil sets on a CPU run or a machine without GPUs).
	Units []gpu.Device
	Slots [][]gpu.Device
	// Notes say what the plan changed or could not do (fewer slots than asked, no GPU).
	Notes []string
}

// planCampaign divides the GPUs of inv named by filterGPUs (MODELQUAL_GPUS) into parallel
// disjoint slots, one per family run side by side, each with at least procs units (one per
// Ginkgo process of the family's run: gpu.Place then gives every process its own). Asked for
// more slots than the GPUs allow, it runs fewer, saying so, or fails where
// MODELQUAL_GPU_SHORTAGE=fail; it never puts two runs on one GPU. A CPU campaign (gpuRun
// false) gets parallel slots without GPUs; a GPU campaign on a machine without NVML too, and
// its gpu specs then skip with NVML's reason.
func planCampaign(inv gpu.Inventory, filterGPUs string, gpuRun bool, parallel, procs int) (campaignPlan, error) {
	if parallel < 1 || procs < 1 {
		return campaignPlan{}, fmt.Errorf("--parallel %d --procs %d: both must be at least 1", parallel, procs)
	}
	plan := campaignPlan{GPURun: gpuRun, Slots: make([][]gpu.Device, parallel)}
	if !gpuRun {
		return plan, nil
	}
	if !inv.Available {
		plan.Notes = append(plan.Notes, "no GPU to place ("+inv.Reason+"): the gpu specs skip, saying why")
		return plan, nil
	}
	units, err := gpu.Select(inv, filterGPUs)
	if err != nil {
		return campaignPlan{}, fmt.Errorf("%s=%q: %w", envconfig.GPUs.Name, filterGPUs, err)
	}
	plan.Units = units
	per := procs * gpu.ServerGPUs
	fits := len(units) / per
	if fits < parallel {
		what := fmt.Sprintf("--parallel %d with --procs %d needs %d GPU unit(s); %s has %d", parallel, procs, parallel*per, describeUnits(filterGPUs), len(units))
		if fails, err := shortagePolicy(); err != nil {
			return campaignPlan{}, err
		} else if fails {
			return campaignPlan{}, fmt.Errorf("%s (%s=fail); lower --parallel or --procs", what, envconfig.GPUShortage.Name)
		}
		if fits == 0 {
			// One slot with every unit: the family's processes beyond them skip, saying why.
			fits = 1
			plan.Notes = append(plan.Notes, what+": running one family at a time on all of them; its Ginkgo processes without a GPU skip their gpu specs")
		} else {
			plan.Notes = append(plan.Notes, fmt.Sprintf("%s: running %d families at a time", what, fits))
		}
		parallel = fits
	}
	plan.Slots = gpu.Split(units, parallel)
	return plan, nil
}

func describeUnits(filter string) string {
	if strings.TrimSpace(filter) == "" {
		return "the machine"
	}
	return envconfig.GPUs.Name + "=" + filter
}

// shortagePolicy reads MODELQUAL_GPU_SHORTAGE (gpu.ShortageFails): true for fail.
func shortagePolicy() (bool, error) {
	fail, err := gpu.ShortageFails(envconfig.GPUShortage.Get())
	if err != nil {
		return false, fmt.Errorf("%s: %w", envconfig.GPUShortage.Name, err)
	}
	return fail, nil
}

// taskLabels mirrors qual/spec's task vocabulary (the CLI does not link the Ginkgo DSL).
var taskLabels = []string{"text", "chat", "stream", "image", "vision", "grpc"}

// gpuCampaign reports whether a campaign over fams with this label filter runs gpu specs:
// MODELQUAL_GPU when set, else whether the filter selects a spec labelled gpu, the family's
// name and at most one gate or task label (the label sets qual/spec's Qualify gives gpu specs).
func gpuCampaign(filter string, fams []familyName) bool {
	switch strings.ToLower(envconfig.GPU.Get()) {
	case "1", "true", "yes":
		return true
	case "0", "false", "no":
		return false
	}
	match, err := types.ParseLabelFilter(filter)
	if err != nil {
		return false
	}
	for _, f := range fams {
		for _, extra := range append(append([]string{""}, gateLabels...), taskLabels...) {
			set := []string{"gpu", f.Folder}
			if extra != "" {
				set = append(set, extra)
			}
			if match(set) {
				return true
			}
		}
	}
	return false
}

// runCampaign runs every family through run, len(slots) at a time, each run on one slot that
// no other run holds meanwhile; the results keep fams' order.
func runCampaign(fams []familyName, slots [][]gpu.Device, run func(familyName, []gpu.Device) familyResult, stop func() bool) []familyResult {
	results := make([]familyResult, len(fams))
	ran := make([]bool, len(fams))
	next := make(chan int)
	var wg sync.WaitGroup
	for _, slot := range slots {
		wg.Add(1)
		go func(slot []gpu.Device) {
			defer wg.Done()
			for i := range next {
				results[i] = run(fams[i], slot)
				ran[i] = true
			}
		}(slot)
	}
	for i := range fams {
		if stop() {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	var out []familyResult
	for i, r := range results {
		if ran[i] {
			out = append(out, r)
		}
	}
	return out
}

// readCards collects the gpu.CardsEntry records of a Ginkgo report's specs and cleanup nodes.
func readCards(reps []types.Report) []gpu.CardUsage {
	var out []gpu.CardUsage
	for _, rep := range reps {
		for _, sr := range rep.SpecReports {
			for _, e := range sr.ReportEntries {
				if e.Name != gpu.CardsEntry {
					continue
				}
				var us []gpu.CardUsage
				if json.Unmarshal([]byte(e.Value.AsJSON), &us) == nil {
					out = append(out, us...)
				}
			}
		}
	}
	return out
}

// printCampaignCards prints the campaign's GPU placement and every card's share (one row per
// unit of the runner, idle ones too).
func printCampaignCards(w io.Writer, plan campaignPlan, results []familyResult, shares []gpu.CardShare) {
	if !plan.GPURun {
		return
	}
	fmt.Fprintln(w, "\nGPU placement:")
	for _, n := range plan.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	for _, r := range results {
		if len(r.GPUs) > 0 {
			fmt.Fprintf(w, "  %s: MODELQUAL_GPUS=%s\n", r.Family, strings.Join(r.GPUs, ","))
		}
	}
	if len(shares) == 0 {
		return
	}
	fmt.Fprintln(w, "\nGPU cards (each card's share of the campaign):")
	gpu.WriteCards(w, shares)
}
