// Stop-string detection during a long decode: the incremental scanner (runtime/engine/stop_strings.h) against
// the whole-text rule it replaced (every step re-detokenised the whole continuation and searched it for every
// stop string, O(n²) in the decode's length).
//  1. A greedy decode of up to `tokens` tokens with 4 stop strings that never occur, through the engine
//  (which
//     uses the scanner), and the same decode without stop strings (each the fastest of 3 runs): what stop
//     detection costs end to end now.
//  2. Both rules replayed on that decode's tokens, step by step as the engine checks them: the time each
//  spends
//     deciding, in all and per token, at several lengths.
// A model whose forward pass is cheap shows the detection cost best:
// ../shared/models/llama-2-tiny-random.gguf (one layer of width 8, a 32000-token SentencePiece vocabulary,
// 4096 positions). usage: bench_stop_strings MODEL.gguf [tokens=4000] [threads=2]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/stop_strings.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"

using namespace choreo;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const std::vector<std::string> kStops = {"never one", "\x01never two", "never three\n", "never, ever, four"};

/// One greedy decode of up to `n_tokens` tokens, timed: the fastest of `repeats` runs.
runtime::DecodeResult decode(runtime::Engine& engine, const model::Model& m, int n_tokens,
                             const std::vector<std::string>& stops, int repeats, double& best_ms) {
  runtime::DecodeRequest d;
  d.header = m.vocab().tokenize("Once upon a time", false);
  d.sampling.temperature = 0;
  d.max_tokens = n_tokens;
  d.stop = stops;
  runtime::DecodeResult result;
  best_ms = 1e300;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_ms();
    result = engine.decode(d);
    best_ms = std::min(best_ms, now_ms() - t0);
    engine.release(result.id);
  }
  return result;
}

/// The rule before the scanner: after each token, the whole continuation so far, searched for every stop.
double whole_text_ms(const model::Vocab& vocab, const std::vector<model::Token>& tokens, size_t n,
                     int& hits) {
  const double t0 = now_ms();
  for (size_t k = 1; k <= n; ++k) {
    std::string text;
    for (size_t i = 0; i < k; ++i) text += vocab.token_to_piece(tokens[i]);
    for (const std::string& s : kStops)
      if (text.find(s) != std::string::npos) ++hits;
  }
  return now_ms() - t0;
}

/// The scanner, fed each token's piece as the engine feeds it.
double scanner_ms(const model::Vocab& vocab, const std::vector<model::Token>& tokens, size_t n, int& hits) {
  const double t0 = now_ms();
  runtime::StopScanner scanner(kStops);
  for (size_t k = 0; k < n; ++k) hits += scanner.append(vocab.token_to_piece(tokens[k]));
  return now_ms() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [tokens=4000] [threads=2]\n", argv[0]);
    return 2;
  }
  const int n_tokens = argc > 2 ? std::atoi(argv[2]) : 4000;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  auto backend = kernels::make_cpu_backend(threads);
  auto m = model::Model::load(argv[1], *backend);
  std::printf("model %s, %d threads, stop strings that never occur: %zu\n", argv[1], threads, kStops.size());

  kv::PagePool pool(m->backend(), m->kv_layout(32), size_t(1) << 30);
  runtime::Engine engine(*m, pool);
  double plain_ms = 0, stops_ms = 0;
  decode(engine, *m, 16, {}, 1, plain_ms);  // warm-up
  const runtime::DecodeResult plain = decode(engine, *m, n_tokens, {}, 3, plain_ms);
  const runtime::DecodeResult with_stops = decode(engine, *m, n_tokens, kStops, 3, stops_ms);
  const std::vector<model::Token>& tokens = with_stops.generated;
  std::printf("\n1. engine decode, %zu tokens generated (%s; without stop strings: %zu, %s)\n", tokens.size(),
              with_stops.stop_reason.c_str(), plain.generated.size(), plain.stop_reason.c_str());
  std::printf("| stop strings | decode ms | ms per token |\n|---|---:|---:|\n");
  std::printf("| none | %.1f | %.4f |\n", plain_ms,
              plain_ms / double(std::max<size_t>(1, plain.generated.size())));
  std::printf("| 4 (scanner) | %.1f | %.4f |\n", stops_ms,
              stops_ms / double(std::max<size_t>(1, tokens.size())));

  std::printf("\n2. deciding after every token, both rules replayed on the first N tokens of that decode\n");
  std::printf(
      "| N | whole-text rule ms | scanner ms | whole-text / scanner | whole-text us per token |"
      " scanner us per token |\n|---:|---:|---:|---:|---:|---:|\n");
  for (size_t n : {size_t(256), size_t(1024), tokens.size()}) {
    if (n > tokens.size()) continue;
    int whole_hits = 0, scanner_hits = 0;
    const double whole = whole_text_ms(m->vocab(), tokens, n, whole_hits);
    const double scanned = scanner_ms(m->vocab(), tokens, n, scanner_hits);
    std::printf("| %zu | %.2f | %.3f | %.0fx | %.2f | %.3f |%s\n", n, whole, scanned, whole / scanned,
                1000 * whole / double(n), 1000 * scanned / double(n),
                whole_hits != 0 || scanner_hits != 0 ? " (a stop string occurred: not comparable)" : "");
    if (n == tokens.size())
      std::printf(
          "\nThe engine before the scanner would have spent about %.0f ms more on this decode "
          "(%.0f%% of its %.0f ms).\n",
          whole - scanned, 100 * (whole - scanned) / stops_ms, stops_ms);
  }
  return 0;
}
