// Prompt Cache on MuSiQue (issue 5, "Done means"): for each item, one PML schema with one module per passage
// (the rules of scripts/musique_to_pml.py), encoded ahead of time on a fresh engine (not timed); then
//  (a) cached: the prompt — every passage imported in order, the question as uncached text — served over the
//      cached modules (runtime/pml/serve.h); TTFT runs from the start of serving (planning, tokenising and
//      prefilling the uncached parts) to the first generated token;
//  (b) full recompute: the very same tokens at the same contiguous positions encoded in one pass, as a server
//      without Prompt Cache would (one engine decode with no parents); TTFT is that decode's time to its
//      first token (tokenising the prompt text is not counted, which favours the baseline).
// Both answers are generated greedily (at most --max-tokens, stopping at a newline) and scored with QA-F1
// against the item's gold answers (max over golds, x100). The summary gives mean TTFTs, the ratio of means
// (full / cached) with a 95% bootstrap interval, mean F1 of each with its interval and the paired difference.
//
// usage: bench_pml [-m MODEL] [--limit N] [-t THREADS] [--json OUT] [--data FILE] [--passages K]
//                  [--max-tokens N]

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "kernels/backend.h"
#include "common/error.h"
#include "common/paths.h"
#include "runtime/engine/engine.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/longbench_metrics.h"
#include "common/statistics.h"
#include "runtime/exec/profile.h"
#include "runtime/kv/page_pool.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/serve.h"

using namespace choreo;

namespace {

/// The system prompt of scripts/musique_to_pml.py (kept word for word so both give the same schemas).
constexpr const char* kSystemPrompt =
    "You answer questions using the passages given. Think about which passages matter, then answer with a "
    "short "
    "phrase only.";

struct BenchOptions {
  std::string model_path;
  std::string data_path;
  std::string json_path;
  int limit = 0;         // 0: every item
  int n_threads = 1;     // see scripts/bench_pml.sh: spin-waiting threads on a shared machine swing TTFT
  int max_passages = 0;  // 0: every passage
  int max_tokens = 32;
  size_t pool_mib = 8192;
};

/// One item's measurements.
struct ItemResult {
  std::string id;
  int n_prompt_tokens = 0;  // tokens the decode sees (BOS excluded)
  int n_cached_tokens = 0;  // of which reused from the ahead-of-time encoding
  int n_fresh_tokens = 0;   // of which encoded at prompt time (uncached text and header)
  double encode_ms = 0;     // the ahead-of-time step (not part of TTFT)
  double ttft_cached_ms = 0, ttft_full_ms = 0;
  std::string answer_cached, answer_full;
  double f1_cached = 0, f1_full = 0;
  double first_logit_diff = 0;  // max |cached - full| over the first generated token's logits
  std::vector<std::string> gold;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// PML text: whitespace collapsed (as the script's " ".join(s.split())), then '&', '<', '>' escaped.
std::string pml_text(const std::string& raw) {
  std::string out;
  bool pending_space = false;
  for (char c : raw) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else
      out += c;
  }
  return out;
}

int passage_count(const eval::Row& row, int max_passages) {
  int n = std::atoi(row.fields.at("n_passages").c_str());
  return max_passages > 0 ? std::min(n, max_passages) : n;
}

/// The item's schema, as scripts/musique_to_pml.py writes it (chat form when the model has a template).
std::string schema_text(const std::string& name, const eval::Row& row, int n_passages, bool chat) {
  std::string s = fmt::format("<schema name=\"{}\">\n", name);
  s += chat ? fmt::format("  <system>{}</system>\n  <user>\n", pml_text(kSystemPrompt))
            : fmt::format("  {}\n", pml_text(kSystemPrompt));
  for (int k = 0; k < n_passages; ++k) {
    const std::string& title = row.fields.at(fmt::format("title_{}", k));
    std::string body = fmt::format("Passage {}", k + 1) + (title.empty() ? "" : " (" + title + ")") + ": " +
                       row.fields.at(fmt::format("passage_{}", k));
    s += fmt::format("    <module name=\"p{}\">{}</module>\n", k, pml_text(body));
  }
  if (chat) s += "  </user>\n";
  return s + "</schema>\n";
}

/// The item's prompt: every passage imported in schema order, the question as uncached text.
std::string prompt_text(const std::string& name, const eval::Row& row, int n_passages, bool chat) {
  std::string imports;
  for (int k = 0; k < n_passages; ++k) imports += fmt::format("<p{}/>", k);
  std::string question = pml_text("Question: " + row.fields.at("question"));
  if (chat)
    return fmt::format("<prompt schema=\"{}\">{}<user>{}</user><assistant/></prompt>", name, imports,
                       question);
  return fmt::format("<prompt schema=\"{}\">{} {} Answer:</prompt>", name, imports, question);
}

double best_f1(const std::string& answer, const std::vector<std::string>& gold) {
  double best = 0;
  for (const std::string& g : gold) best = std::max(best, eval::qa_f1_score(answer, g));
  return best * 100;
}

std::string trimmed(const std::string& text) {
  size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
}

ItemResult run_item(const model::Model& m, const BenchOptions& o, const eval::Row& row) {
  ItemResult r;
  r.id = row.id;
  r.gold = row.gold;
  const bool chat = m.chat_format() != model::ChatFormat::None;
  const std::string name = "musique-" + row.id;
  const int n_passages = passage_count(row, o.max_passages);
  dsl::pml::Schema schema = dsl::pml::parse_schema(schema_text(name, row, n_passages, chat), name + ".pml");
  dsl::pml::Prompt prompt =
      dsl::pml::parse_prompt(prompt_text(name, row, n_passages, chat), {name + ".prompt", 1, 1});

  // A fresh engine and pool per item: memory stays bounded and no item sees another's encodings.
  kv::PagePool pool(m.backend(), m.kv_layout(32), o.pool_mib << 20);
  runtime::Engine engine(m, pool);
  double t0 = now_ms();
  runtime::pml::EncodedSchema encoded = runtime::pml::encode_schema(engine, schema);
  r.encode_ms = now_ms() - t0;

  runtime::pml::ServeOptions serve;
  serve.sampling.temperature = 0;
  serve.max_tokens = o.max_tokens;
  serve.stop = {"\n"};
  serve.record_logits = true;
  t0 = now_ms();
  runtime::pml::ServeResult cached = runtime::pml::serve_prompt(engine, encoded, prompt, serve);
  const double serve_ms = now_ms() - t0;
  // Serving = planning + fresh prefills + the decode; the decode's own time after its first token is not
  // TTFT.
  r.ttft_cached_ms = serve_ms - (cached.decode.stats.total_ms - cached.decode.stats.ttft_ms);
  r.answer_cached = trimmed(cached.decode.text);
  r.n_cached_tokens = cached.n_cached_tokens;

  std::vector<model::Token> tokens;
  int expect_pos = engine.first_pos();
  for (const auto& [pos, token] : cached.plan.positioned_tokens()) {
    if (pos != expect_pos)
      throw RuntimeFailure(
          fmt::format("item {}: the prompt's positions are not contiguous at {}", row.id, pos));
    tokens.push_back(token);
    ++expect_pos;
  }
  r.n_prompt_tokens = int(tokens.size());
  r.n_fresh_tokens = r.n_prompt_tokens - r.n_cached_tokens;

  runtime::DecodeRequest full;
  full.header = std::move(tokens);
  full.new_offset = engine.first_pos();
  full.sampling.temperature = 0;
  full.max_tokens = o.max_tokens;
  full.stop = {"\n"};
  full.record_logits = true;
  runtime::DecodeResult plain = engine.decode(full);
  r.ttft_full_ms = plain.stats.ttft_ms;
  r.answer_full = trimmed(plain.text);
  const std::vector<float>& a = cached.decode.logits.front();
  const std::vector<float>& b = plain.logits.front();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    r.first_logit_diff = std::max(r.first_logit_diff, double(std::fabs(a[i] - b[i])));

  r.f1_cached = best_f1(r.answer_cached, row.gold);
  r.f1_full = best_f1(r.answer_full, row.gold);
  return r;
}

void print_summary(const std::vector<ItemResult>& results, nlohmann::json& report) {
  std::vector<double> cached_ms, full_ms, f1_cached, f1_full;
  int identical = 0;
  double prompt_tokens = 0;
  for (const ItemResult& r : results) {
    cached_ms.push_back(r.ttft_cached_ms);
    full_ms.push_back(r.ttft_full_ms);
    f1_cached.push_back(r.f1_cached);
    f1_full.push_back(r.f1_full);
    identical += r.answer_cached == r.answer_full ? 1 : 0;
    prompt_tokens += r.n_prompt_tokens;
  }
  const size_t n = results.size();
  const stats::RatioEstimate ratio = stats::bootstrap_ratio(full_ms, cached_ms);
  const stats::Estimate mean_cached = stats::bootstrap_mean(cached_ms),
                       mean_full = stats::bootstrap_mean(full_ms);
  const stats::Estimate f1c = stats::bootstrap_mean(f1_cached), f1f = stats::bootstrap_mean(f1_full);
  const stats::Estimate diff = stats::paired_difference(f1_full, f1_cached);
  std::printf("\nsummary over %zu items (mean prompt %.0f tokens)\n", n, prompt_tokens / double(n));
  std::printf("  TTFT cached  %9.1f ms  [%.1f, %.1f]\n", mean_cached.mean, mean_cached.low, mean_cached.high);
  std::printf("  TTFT full    %9.1f ms  [%.1f, %.1f]\n", mean_full.mean, mean_full.low, mean_full.high);
  std::printf("  speed-up (mean full / mean cached) %.1fx  95%% CI [%.1f, %.1f]\n", ratio.ratio, ratio.low,
              ratio.high);
  std::printf("  QA-F1 cached %5.1f  [%.1f, %.1f]\n", f1c.mean, f1c.low, f1c.high);
  std::printf("  QA-F1 full   %5.1f  [%.1f, %.1f]\n", f1f.mean, f1f.low, f1f.high);
  std::printf("  F1 cached - full  %+.2f  [%+.2f, %+.2f]; identical answers %d/%zu\n", diff.mean, diff.low,
              diff.high, identical, n);
  auto estimate = [](const stats::Estimate& e) {
    return nlohmann::json{{"mean", e.mean}, {"low", e.low}, {"high", e.high}};
  };
  report["summary"] = {{"items", n},
                       {"mean_prompt_tokens", prompt_tokens / double(n)},
                       {"ttft_cached_ms", estimate(mean_cached)},
                       {"ttft_full_ms", estimate(mean_full)},
                       {"speedup", {{"ratio", ratio.ratio}, {"low", ratio.low}, {"high", ratio.high}}},
                       {"f1_cached", estimate(f1c)},
                       {"f1_full", estimate(f1f)},
                       {"f1_cached_minus_full", estimate(diff)},
                       {"identical_answers", identical}};
}

nlohmann::json item_json(const ItemResult& r) {
  return {{"id", r.id},
          {"prompt_tokens", r.n_prompt_tokens},
          {"cached_tokens", r.n_cached_tokens},
          {"fresh_tokens", r.n_fresh_tokens},
          {"encode_ms", r.encode_ms},
          {"ttft_cached_ms", r.ttft_cached_ms},
          {"ttft_full_ms", r.ttft_full_ms},
          {"answer_cached", r.answer_cached},
          {"answer_full", r.answer_full},
          {"f1_cached", r.f1_cached},
          {"f1_full", r.f1_full},
          {"first_logit_max_abs_diff", r.first_logit_diff},
          {"gold", r.gold}};
}

[[noreturn]] void usage(const char* program, const std::string& problem) {
  std::fprintf(
      stderr,
      "%s: %s\nusage: %s [-m MODEL] [--limit N] [-t THREADS] [--json OUT] [--data FILE] [--passages K] "
      "[--max-tokens N] [--pool-mib MIB]\n",
      program, problem.c_str(), program);
  std::exit(2);
}

BenchOptions parse_arguments(int argc, char** argv) {
  BenchOptions o;
  const char* shared = std::getenv("CHOREO_SHARED");
  o.data_path = std::string(shared ? shared : "../shared") + "/data/cacheblend_musique_s.json";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], flag + " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0 || n > 1000000)
        usage(argv[0], flag + " needs a whole number >= 0");
      return int(n);
    };
    if (flag == "-m" || flag == "--model")
      o.model_path = value();
    else if (flag == "--limit")
      o.limit = number();
    else if (flag == "-t" || flag == "--threads")
      o.n_threads = number();
    else if (flag == "--json")
      o.json_path = value();
    else if (flag == "--data")
      o.data_path = value();
    else if (flag == "--passages")
      o.max_passages = number();
    else if (flag == "--max-tokens")
      o.max_tokens = number();
    else if (flag == "--pool-mib")
      o.pool_mib = size_t(number());
    else
      usage(argv[0], "unknown argument '" + flag + "'");
  }
  if (o.model_path.empty()) o.model_path = default_model_path();
  return o;
}

int run(const BenchOptions& o) {
  eval::Dataset data = eval::load_dataset(o.data_path, eval::DataFormat::musique);
  std::vector<eval::Row>& rows = data.rows;
  if (o.limit > 0 && size_t(o.limit) < rows.size()) rows.resize(size_t(o.limit));
  auto backend = kernels::make_cpu_backend(o.n_threads);
  auto m = model::Model::load(o.model_path, *backend);
  std::printf("bench_pml: %s, %d threads, %zu MuSiQue items%s, greedy, at most %d tokens per answer\n",
              o.model_path.c_str(), o.n_threads, rows.size(),
              o.max_passages > 0 ? fmt::format(" (first {} passages each)", o.max_passages).c_str() : "",
              o.max_tokens);
  std::printf("%-4s %7s %7s %10s %10s %7s %6s %6s %7s  %s\n", "item", "tokens", "cached", "ttft-cach",
              "ttft-full", "ratio", "F1-c", "F1-f", "dlogit", "answer cached | answer full");
  nlohmann::json report;
  report["model"] = o.model_path;
  report["threads"] = o.n_threads;
  report["max_passages"] = o.max_passages;
  report["items"] = nlohmann::json::array();
  std::vector<ItemResult> results;
  for (const eval::Row& row : rows) {
    ItemResult r;
    try {
      r = run_item(*m, o, row);
    } catch (const InputError& e) {  // e.g. a prompt longer than the model's context
      std::printf("%-4s skipped: %s\n", row.id.c_str(), e.message().c_str());
      continue;
    }
    std::printf("%-4s %7d %7d %8.1fms %8.1fms %6.1fx %6.1f %6.1f %7.3f  %s | %s\n", r.id.c_str(),
                r.n_prompt_tokens, r.n_cached_tokens, r.ttft_cached_ms, r.ttft_full_ms,
                r.ttft_full_ms / r.ttft_cached_ms, r.f1_cached, r.f1_full, r.first_logit_diff,
                r.answer_cached.c_str(), r.answer_full.c_str());
    std::fflush(stdout);
    report["items"].push_back(item_json(r));
    results.push_back(std::move(r));
  }
  if (results.empty()) {
    std::fprintf(stderr, "bench_pml: no item was measured\n");
    return 1;
  }
  print_summary(results, report);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << report.dump(2) << "\n";
    if (!out) throw RuntimeFailure(fmt::format("cannot write {}", o.json_path));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const BenchOptions options = parse_arguments(argc, argv);
  try {
    return run(options);
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s\n", e.render().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pml: %s\n", e.what());
    return 1;
  }
}
