package mutants

import "fmt"

// Catalog lists the planted defects of `qual mutants`, built from each family's part
// (catalog_<family>.go, declared from an init function), so adding a family's defects edits no
// shared list. Each is a defect that has happened or could happen in review, in the model math,
// the tokenizer, the server's contract or the harness's own statistics; issue 40's first fourteen
// were missed by the premerge gate before the natural-EOS, stop-string, chat-usage, concurrency,
// failure-records and percentile gates existed.
//
// A defect is planted one of two ways:
//   - a source edit: an Old text that occurs exactly once in File, replaced by New;
//   - a planted fault: Fault names a switch of MODELQUAL_FAULTS (family.fault_name, or engine.*
//     and server.* for the shared engine and server), read by File, which the campaign sets for
//     the gate's run. The runtime and the server define no fault outside this list
//     (TestEveryFaultIsCatalogued).
//
// To add a defect: add an entry to the family's part, naming the defect as a reviewer would
// describe it, with the gates (labels) that concern it: parity for model math, tokenizer and
// generation semantics, contract for the request contract and records, load for the load
// generator and statistics. TestCatalogApplies checks that every entry still applies to the
// current source.
var Catalog []Mutant

// declare adds family's defects to Catalog; the family is the suite whose premerge gate must
// catch them. An entry must not name another family.
func declare(family string, ms []Mutant) {
	for _, m := range ms {
		if m.Family != "" && m.Family != family {
			panic(fmt.Sprintf("mutants: %q is declared by family %s but names family %s", m.Name, family, m.Family))
		}
		m.Family = family
		Catalog = append(Catalog, m)
	}
}
