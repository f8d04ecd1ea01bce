# Summarises `go test -bench` output (make bench, make bench-load): each figure
# that has a goal-<figure> metric beside it is printed with its goal and whether it is met.
# Higher is better for rates (units ending in /s), lower for everything else. The raw lines
# are kept above the summary, since a shared machine makes single runs noisy.
/^Benchmark/ {
	name = $1
	sub(/-[0-9]+$/, "", name)
	delete v
	for (i = 3; i < NF; i += 2) v[$(i + 1)] = $i
	for (u in v) {
		if (u !~ /^goal-/) continue
		m = substr(u, 6)
		if (!(m in v)) continue
		higher = (m ~ /\/s$/)
		ok = higher ? (v[m] + 0 >= v[u] + 0) : (v[m] + 0 <= v[u] + 0)
		line = sprintf("%-32s %-20s %12.4g  goal %s %-10g %s", name, m, v[m], higher ? ">=" : "<=", v[u], ok ? "met" : "NOT MET")
		if ("client-cpu-%core" in v) line = line sprintf("  (client CPU %.1f%% of a core%s)", v["client-cpu-%core"], ("pacer-class" in v) ? (v["pacer-class"] + 0 == 2 ? ", pacer SCHED_FIFO" : v["pacer-class"] + 0 == 1 ? ", pacer nice -20" : ", pacer in the normal class") : "")
		out[++n] = line
	}
}
{ print }
END {
	print ""
	print "figure vs goal:"
	for (i = 1; i <= n; i++) print out[i]
}
