// kprof.cc: a CUPTI injection library that times every GPU kernel of a process and prints, at
// exit, each kernel name's count and total device time (lab, not product). The CUDA driver loads
// it into any process started with CUDA_INJECTION64_PATH=.../libkprof.so (a Go binary through
// cgo, python with torch), so ours and diffusers' pipelines are profiled the same way, CUDA-graph
// replays included, where the GPU host has no nsys. Build: lab/cuda/kprof/build.sh.
// KPROF_OUT: the file the table goes to (default stderr); KPROF_TOP: rows (default 40).
// Runtime-API calls are recorded too: their time by name (KAPI) and, for each of the largest idle
// gaps, the calls that ran inside it (KGAPAPI), so a host stall is seen as, say, a graph
// instantiation or an allocation, or as no CUDA call at all (host computation).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifndef KREC
#error "KREC: the CUPTI header's newest kernel record (CUpti_ActivityKernelN); build.sh finds it"
#endif

namespace {
struct Agg {
  unsigned long long ns = 0, n = 0;
};
std::mutex mu;
std::map<std::string, Agg> by_name;
struct Span {
  unsigned long long start, end;
  const std::string *name;  // by_name's key
};
std::vector<Span> spans;  // every kernel, for the idle gaps between them
std::vector<Span> apis;   // every runtime-API call
std::map<std::string, Agg> api_by_name;
unsigned long long total_ns = 0;
size_t dropped = 0;  // records CUPTI reports it dropped (a buffer full, none given in time)

std::string pretty(const char *mangled) {
  if (!mangled) return "?";
  int st = 0;
  char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &st);
  std::string s = st == 0 && d ? d : mangled;
  free(d);
  // templates make names long: keep the function and its first template arguments
  if (s.size() > 110) s = s.substr(0, 110) + "...";
  return s;
}

void CUPTIAPI requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *size = 16 << 20;
  *buf = static_cast<uint8_t *>(aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, *size));
  *max_records = 0;
}

void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t, size_t valid) {
  CUpti_Activity *r = nullptr;
  std::lock_guard<std::mutex> g(mu);
  size_t d = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &d) == CUPTI_SUCCESS) dropped += d;
  while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const CUpti_ActivityAPI *a = reinterpret_cast<const CUpti_ActivityAPI *>(r);
      const char *nm = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &nm) != CUPTI_SUCCESS || !nm) nm = "?";
      auto it = api_by_name.emplace(nm, Agg{}).first;
      it->second.ns += a->end - a->start, it->second.n++;
      if (a->start) apis.push_back({a->start, a->end, &it->first});
      continue;
    }
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const KREC *k = reinterpret_cast<const KREC *>(r);
    if (k->start == 0 || k->end < k->start) continue;  // an incomplete record
    auto it = by_name.emplace(pretty(k->name), Agg{}).first;
    Agg &a = it->second;
    a.ns += k->end - k->start, a.n++;
    spans.push_back({k->start, k->end, &it->first});
    total_ns += k->end - k->start;
  }
  free(buf);
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> g(mu);
  const char *path = getenv("KPROF_OUT");
  FILE *f = path ? fopen(path, "w") : stderr;
  if (!f) f = stderr;
  std::vector<std::pair<std::string, Agg>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](auto &a, auto &b) { return a.second.ns > b.second.ns; });
  const int top = getenv("KPROF_TOP") ? atoi(getenv("KPROF_TOP")) : 40;
  fprintf(f, "KPROF kernels %zu names, device busy %.3f ms, %zu records dropped by CUPTI\n", rows.size(), total_ns / 1e6, dropped);
  int i = 0;
  for (auto &r : rows) {
    if (i++ >= top) break;
    fprintf(f, "KPROF %10.3f ms %5.1f%% %8llu x %9.2f us  %s\n", r.second.ns / 1e6, 100.0 * r.second.ns / (total_ns ? total_ns : 1),
            r.second.n, r.second.ns / 1e3 / r.second.n, r.first.c_str());
  }
  // Idle device time: the gaps between one kernel's end and the next one's start (KPROF_GAP_US,
  // default 100), summed by the pair of kernels around them, so host work that starves the GPU
  // shows where in the pipeline it sits.
  std::sort(spans.begin(), spans.end(), [](const Span &a, const Span &b) { return a.start < b.start; });
  const double gap_us = getenv("KPROF_GAP_US") ? atof(getenv("KPROF_GAP_US")) : 100;
  std::map<std::pair<const std::string *, const std::string *>, Agg> gaps;
  unsigned long long idle = 0, end = 0;
  for (size_t i = 0; i < spans.size(); i++) {
    if (i && spans[i].start > end && (spans[i].start - end) / 1e3 >= gap_us) {
      Agg &g = gaps[{spans[i - 1].name, spans[i].name}];
      g.ns += spans[i].start - end, g.n++;
      idle += spans[i].start - end;
    }
    end = std::max(end, spans[i].end);
  }
  std::vector<std::pair<std::pair<const std::string *, const std::string *>, Agg>> grows(gaps.begin(), gaps.end());
  std::sort(grows.begin(), grows.end(), [](auto &a, auto &b) { return a.second.ns > b.second.ns; });
  fprintf(f, "KGAP first kernel to last %.3f ms; idle in gaps of %.0f us or more: %.3f ms\n",
          spans.empty() ? 0.0 : (end - spans.front().start) / 1e6, gap_us, idle / 1e6);
  i = 0;
  for (auto &g : grows) {
    if (i++ >= 20) break;
    fprintf(f, "KGAP %10.3f ms %6llu x  after %.60s  before %.60s\n", g.second.ns / 1e6, g.second.n, g.first.first->c_str(),
            g.first.second->c_str());
  }
  // the largest single gaps, at their time from the first kernel (which run of the process)
  std::vector<std::pair<unsigned long long, size_t>> big;
  end = 0;
  for (size_t j = 0; j < spans.size(); j++) {
    if (j && spans[j].start > end) big.push_back({spans[j].start - end, j});
    end = std::max(end, spans[j].end);
  }
  std::sort(big.begin(), big.end(), [](auto &a, auto &b) { return a.first > b.first; });
  for (size_t j = 0; j < big.size() && j < 12; j++) {
    const Span &sp = spans[big[j].second];
    fprintf(f, "KGAP1 %9.3f ms at %10.3f ms  before %.70s\n", big[j].first / 1e6, (sp.start - spans.front().start) / 1e6,
            sp.name->c_str());
  }
  // host time in runtime-API calls, by name, and the calls inside the largest gaps
  std::vector<std::pair<std::string, Agg>> arows(api_by_name.begin(), api_by_name.end());
  std::sort(arows.begin(), arows.end(), [](auto &a, auto &b) { return a.second.ns > b.second.ns; });
  for (size_t j = 0; j < arows.size() && j < 15; j++)
    fprintf(f, "KAPI %10.3f ms %8llu x %9.2f us  %s\n", arows[j].second.ns / 1e6, arows[j].second.n,
            arows[j].second.ns / 1e3 / arows[j].second.n, arows[j].first.c_str());
  std::sort(apis.begin(), apis.end(), [](const Span &a, const Span &b) { return a.start < b.start; });
  for (size_t j = 0; j < big.size() && j < 4; j++) {
    const Span &after = spans[big[j].second];
    const unsigned long long g1 = after.start, g0 = g1 - big[j].first;
    std::map<const std::string *, Agg> in;
    unsigned long long covered = 0;
    for (const Span &a : apis) {
      if (a.end <= g0 || a.start >= g1) continue;
      const unsigned long long d = std::min(a.end, g1) - std::max(a.start, g0);
      in[a.name].ns += d, in[a.name].n++, covered += d;
    }
    fprintf(f, "KGAPAPI gap %.3f ms at %.3f ms: %.3f ms inside runtime-API calls\n", big[j].first / 1e6,
            (g0 - spans.front().start) / 1e6, covered / 1e6);
    for (auto &kv : in)
      if (kv.second.ns >= 100000) fprintf(f, "KGAPAPI   %10.3f ms %6llu x  %s\n", kv.second.ns / 1e6, kv.second.n, kv.first->c_str());
  }
  // every name, for grouping afterwards (lab/cuda/kprof/group.py)
  for (auto &r : rows) fprintf(f, "KPROFALL\t%llu\t%llu\t%s\n", r.second.ns, r.second.n, r.first.c_str());
  if (f != stderr) fclose(f);
}
}  // namespace

// A Go program ends with the exit_group system call, not libc's exit, so atexit never runs in
// qual: the table is also rewritten every KPROF_PERIOD_MS (default 250) from a thread, and the
// last one written holds every kernel that ended before the process did (its last image's
// kernels end before the host encodes the PNG).
extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  atexit(report);
  const int period = getenv("KPROF_PERIOD_MS") ? atoi(getenv("KPROF_PERIOD_MS")) : 250;
  if (getenv("KPROF_OUT") && period > 0)
    std::thread([period] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(period));
        report();
      }
    }).detach();
  return 1;
}
