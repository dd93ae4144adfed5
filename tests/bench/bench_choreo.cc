// Prompt Choreography speed, measured against baselines in the same run (issue: choreography cache):
//  1. TTFT of a decode whose parents hold N cached tokens, in choreo, prefix and naive modes — for the first call
//     over those parents, and for a later call that lists the same parents in another order (what an agent
//     reading its peers' answers does; prefix caching only reuses the common prefix).
//  2. Parallel decode throughput for B = 1, 2, 4, 8 messages decoded together.
//  3. The cost of query-side rotation: decoding over parents placed away from their encoded positions vs at
//     them.
// usage: bench_choreo MODEL.gguf [threads=2] [contexts=2048,8192]

#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"

using namespace choreo;
using runtime::DecodeRequest;
using runtime::Engine;
using runtime::Mode;
using runtime::Parent;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<model::Token> random_tokens(const model::Model& m, int n, std::mt19937& rng) {
  std::vector<model::Token> t(n);
  const int lo = 300, hi = std::min(m.config().n_vocab, 30000);
  for (auto& x : t) x = model::Token(lo + rng() % (hi - lo));
  return t;
}

/// Four parent messages holding n_cached tokens in all, prefilled (untimed) in the engine's mode.
std::vector<Parent> make_parents(Engine& e, const std::vector<std::vector<model::Token>>& texts) {
  std::vector<Parent> parents;
  for (const auto& t : texts) parents.push_back({e.prefill({t, {}, {}, "", kv::Visibility::Public}).id, {}, {}});
  return parents;
}

DecodeRequest one_token(std::vector<Parent> parents, std::vector<model::Token> header) {
  DecodeRequest d;
  d.header = std::move(header);
  d.parents = std::move(parents);
  d.sampling.temperature = 0;
  d.exact_tokens = 1;
  return d;
}

void ttft(const model::Model& m, int n_cached) {
  std::mt19937 rng(n_cached);
  std::vector<std::vector<model::Token>> texts;
  for (int i = 0; i < 4; ++i) texts.push_back(random_tokens(m, n_cached / 4, rng));
  auto header1 = random_tokens(m, 8, rng), header2 = random_tokens(m, 8, rng), header3 = random_tokens(m, 8, rng);
  std::printf("\nTTFT, decode over 4 parents holding %d tokens (header 8 tokens, 1 generated): a first call, a call "
              "over the same parents in the same order, one over them reordered\n", n_cached);
  std::printf("| mode | first ms | same order ms | reordered ms | computed (1st/same/reord.) | reused (1st/same/reord.) |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  double choreo_first = 0, choreo_same = 0, choreo_second = 0;
  for (Mode mode : {Mode::Choreo, Mode::Prefix, Mode::Naive}) {
    kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(12) << 30);
    Engine e(m, pool, mode);
    std::vector<Parent> parents = make_parents(e, texts);
    double t0 = now_ms();
    auto r1 = e.decode(one_token(parents, header1));
    double first = now_ms() - t0;
    t0 = now_ms();
    auto r_same = e.decode(one_token(parents, header3));
    double same = now_ms() - t0;
    std::vector<Parent> reordered = {parents[1], parents[0], parents[3], parents[2]};
    t0 = now_ms();
    auto r2 = e.decode(one_token(reordered, header2));
    double second = now_ms() - t0;
    if (mode == Mode::Choreo) choreo_first = first, choreo_same = same, choreo_second = second;
    std::printf("| %s | %.1f | %.1f | %.1f | %d / %d / %d | %d / %d / %d |\n", std::string(runtime::mode_name(mode)).c_str(),
                first, same, second, r1.stats.n_computed, r_same.stats.n_computed, r2.stats.n_computed,
                r1.stats.n_reused, r_same.stats.n_reused, r2.stats.n_reused);
    if (mode != Mode::Choreo)
      std::printf("| ratio %s/choreo | %.1fx | %.1fx | %.1fx | | |\n", std::string(runtime::mode_name(mode)).c_str(),
                  first / choreo_first, same / choreo_same, second / choreo_second);
  }
}

void parallel_decode(const model::Model& m) {
  std::mt19937 rng(7);
  std::printf("\nParallel decode: B messages over one 512-token parent, 64 tokens each, one batched step per token\n");
  std::printf("| B | total tok/s | ms per step | speed-up vs B=1 |\n|---|---:|---:|---:|\n");
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(8) << 30);
  Engine e(m, pool);
  auto parent = e.prefill({random_tokens(m, 512, rng), {}, {}, "", kv::Visibility::Public}).id;
  double base = 0;
  for (int B : {1, 2, 4, 8}) {
    std::vector<DecodeRequest> reqs;
    for (int i = 0; i < B; ++i) {
      DecodeRequest d;
      d.header = random_tokens(m, 4, rng);
      d.parents = {{parent, {}, {}}};
      d.sampling = {0.8f, 40, 0.95f, uint64_t(i)};
      d.exact_tokens = 64;
      reqs.push_back(d);
    }
    double t0 = now_ms();
    e.decode_batch(reqs);
    double dt = (now_ms() - t0) / 1000.0;
    double tps = B * 64 / dt;
    if (B == 1) base = tps;
    std::printf("| %d | %.1f | %.2f | %.2fx |\n", B, tps, dt * 1000 / 64, tps / base);
  }
}

void rotation_overhead(const model::Model& m) {
  std::mt19937 rng(9);
  std::printf("\nQuery-side rotation: 64-token decode over 4 parents of 512 tokens, placed as encoded vs shifted\n");
  std::printf("| placement | tok/s |\n|---|---:|\n");
  kv::PagePool pool(m.backend(), m.kv_layout(32), size_t(8) << 30);
  Engine e(m, pool);
  std::vector<Parent> parents;
  int pos = e.first_pos();
  for (int i = 0; i < 4; ++i) {
    // Encoded one after another at distinct positions, so the default placement has delta 0 everywhere.
    parents.push_back({e.prefill({random_tokens(m, 512, rng), {}, pos, "", kv::Visibility::Public}).id, {}, {}});
    pos += 512;
  }
  std::vector<Parent> shifted = {{parents[2].message, e.first_pos(), {}}, {parents[0].message, {}, {}},
                                 {parents[3].message, {}, {}}, {parents[1].message, {}, {}}};
  double tps[2];
  for (int variant = 0; variant < 2; ++variant) {
    DecodeRequest d;
    d.header = random_tokens(m, 4, rng);
    d.parents = variant == 0 ? parents : shifted;
    d.sampling.temperature = 0;
    d.exact_tokens = 64;
    e.decode(d);  // warm-up
    double t0 = now_ms();
    e.decode(d);
    tps[variant] = 64 / ((now_ms() - t0) / 1000.0);
  }
  std::printf("| as encoded (delta 0) | %.1f |\n| reordered (every delta != 0) | %.1f |\n", tps[0], tps[1]);
  std::printf("rotation overhead: %.1f%%\n", (tps[0] / tps[1] - 1) * 100);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [threads=2] [contexts=2048,8192]\n", argv[0]);
    return 2;
  }
  int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  std::vector<int> contexts = {2048, 8192};
  if (argc > 3) {
    contexts.clear();
    std::stringstream ss(argv[3]);
    for (std::string item; std::getline(ss, item, ',');) contexts.push_back(std::stoi(item));
  }
  auto backend = kernels::make_cpu_backend(threads);
  auto m = model::Model::load(argv[1], *backend);
  std::printf("model %s, %d threads\n", argv[1], threads);
  for (int n : contexts) {
    if (n + 16 > m->config().n_ctx_train) n = m->config().n_ctx_train - 16;
    ttft(*m, n / 4 * 4);
  }
  parallel_decode(*m);
  rotation_overhead(*m);
}
