// models/mock.cc: the mock family: no weights, one deterministic token per step after a set
// delay. It measures the serving path's own cost (HTTP, scheduling, streaming) with an engine
// whose cadence is known exactly, as serving teams do with a CPU engine mock.
//
// The token generated at sequence position p is mock_token(p): the GPT-2 byte-level ids of
// 'a'..'z' in a cycle (ids 64..89), so detokenized output reads "abc...", or p mod vocab for a
// vocabulary too small to hold them.
#include <time.h>

#include "runtime.h"

namespace mq {
namespace {

class Mock : public Backend {
 public:
  explicit Mock(const ModelArgs &a) : V_(a.hp->i("vocab_size")), delay_ns_(a.hp->i64("step_delay_ns")) {}
  int vocab() const override { return V_; }
  bool deterministic() const override { return true; }

  int32_t token_at(int p) const { return V_ >= 90 ? 64 + p % 26 : p % V_; }

  // forward writes logits (the one-hot rows of logits_all) only when asked: a logprobs request.
  void forward(const Batch &b, float *logits, int32_t *argmax) override {
    if (delay_ns_ > 0) {
      struct timespec ts = {(time_t)(delay_ns_ / 1000000000LL), (long)(delay_ns_ % 1000000000LL)};
      while (nanosleep(&ts, &ts) != 0) {
      }
    }
    for (int i = 0; i < b.n; i++) {
      argmax[i] = token_at(b.pos[i] + b.ntok[i]);
      if (logits) {
        float *row = logits + (size_t)i * V_;
        for (int v = 0; v < V_; v++) row[v] = 0.f;
        row[argmax[i]] = 1.f;
      }
    }
  }

  // logits_all: a one-hot distribution on the token forward would generate next.
  void logits_all(const int32_t *ids, int n, int slot, float *out) override {
    (void)ids;
    (void)slot;
    for (int j = 0; j < n; j++) {
      float *row = out + (size_t)j * V_;
      for (int v = 0; v < V_; v++) row[v] = 0.f;
      row[token_at(j + 1)] = 1.f;
    }
  }

 private:
  int V_;
  int64_t delay_ns_;
};

}  // namespace

void resolve_mock(const Config &c, HParams &hp) {
  hp.set("vocab_size", (double)c.positive("vocab_size"));
  hp.set("max_positions", (double)(c.has("max_position_embeddings") ? c.positive("max_position_embeddings") : 1 << 20));
  const int64_t delay = c.integer("step_delay_ns", 0);
  if (delay < 0) throw Error(MQ_ERR_LOAD, "config.json: step_delay_ns " + std::to_string(delay) + " is negative");
  hp.set("step_delay_ns", (double)delay);
}

std::unique_ptr<Backend> make_mock(const ModelArgs &a) { return std::unique_ptr<Backend>(new Mock(a)); }

// One thread: the mock does no arithmetic worth spreading.
MQ_REGISTER_FAMILY(Family{"mock", "text", {"MockForCausalLM"}, resolve_mock, make_mock, 1});

}  // namespace mq
