// `choreo encode`: lays out and encodes a PML schema ahead of time (docs/pml.md), printing every module's
// positions and token counts; with --prompt, serves one prompt over the encoded modules. Unless --no-store,
// the encodings go to the persistent store (docs/store.md): pieces found there are loaded instead of
// computed, and every piece computed is persisted, tagged with a hash of the schema file's bytes.

#include <unistd.h>
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "common/error.h"
#include "common/input_file.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/open_engine.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/persist.h"
#include "runtime/pml/serve.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/redis_store.h"
#include "common/terminal_text.h"

namespace choreo::cli {

namespace {

struct EncodeOptions {
  std::string schema_path, prompt, prompt_file;
  EngineFlags engine;
  int max_tokens = 128;
  float temperature = 0.0f;
  uint64_t seed = 42;
};

void print_layout(const runtime::pml::EncodedSchema& enc) {
  const runtime::pml::Layout& l = enc.layout;
  std::printf("schema %s: %zu modules, %zu pieces, positions %d..%d\n", l.schema_name.c_str(),
              l.modules.size(), l.pieces.size(), l.first_pos, l.end_pos);
  std::printf("%-40s %7s %9s %7s %s\n", "module", "start", "positions", "tokens", "cache");
  int schema_tokens = 0;
  for (const runtime::pml::Piece& p : l.pieces)
    if (p.module < 0) schema_tokens += int(p.tokens.size());
  std::printf("%-40s %7s %9s %7d %s\n", "(schema text)", "-", "-", schema_tokens, "yes");
  for (const runtime::pml::ModuleLayout& m : l.modules) {
    int tokens = 0;
    for (int p : m.pieces)
      if (l.pieces[p].kind == runtime::pml::Piece::Kind::Text) tokens += int(l.pieces[p].tokens.size());
    std::string name = std::string(2 * size_t(std::count(m.path.begin(), m.path.end(), '/')), ' ') + m.name;
    for (int s : m.slots) name += fmt::format(" [{}:{}]", l.pieces[s].parameter, l.pieces[s].n_positions);
    std::printf("%-40s %7d %9d %7d %s\n", name.c_str(), m.start_pos, m.n_positions, tokens,
                m.cached ? "yes" : "per request");
  }
  std::printf("encoded: %d tokens computed, %d pieces already cached, %.1f ms\n", enc.n_computed,
              enc.n_deduplicated, enc.total_ms);
}

/// The store tag of a schema: XXH3 of its file's bytes (0 is "no tag" in the store, so it is avoided).
uint64_t schema_tag(const std::string& bytes) {
  const uint64_t tag = XXH3_64bits(bytes.data(), bytes.size());
  return tag == 0 ? 1 : tag;
}

/// Reads --prompt or --prompt-file and parses it (before the model loads: a typo fails fast).
std::optional<dsl::pml::Prompt> read_prompt(const EncodeOptions& o) {
  std::string prompt_text = o.prompt;
  SourceLocation prompt_origin{"--prompt", 1, 1};
  if (!o.prompt_file.empty()) {
    prompt_text = read_input_file(o.prompt_file, "prompt file", input_policy().file_bytes);
    if (prompt_text.find_first_not_of(" \t\r\n") == std::string::npos)
      throw InputError(fmt::format("prompt file '{}' is empty", o.prompt_file),
                       "write a PML prompt (<prompt schema=\"...\">...</prompt>) in it, or leave out --prompt-file",
                       SourceLocation{o.prompt_file, 0, 0});
    prompt_origin = {o.prompt_file, 1, 1};
  }
  if (prompt_text.empty()) return std::nullopt;
  return dsl::pml::parse_prompt(prompt_text, prompt_origin);
}

void run_encode(EncodeOptions& o) {
  o.engine.resolve();
  std::string schema_bytes;
  dsl::pml::Schema schema = dsl::pml::load_schema(o.schema_path, &schema_bytes);
  const uint64_t tag = schema_tag(schema_bytes);
  const std::optional<dsl::pml::Prompt> prompt = read_prompt(o);
  // Prefills look in the store first (and in T3 after it); we persist below, with the schema's tag. Every
  // piece computed is written to T3.
  const std::unique_ptr<runtime::OpenedEngine> opened = runtime::open_engine(
      o.engine.model_options(), o.engine.engine_options(runtime::Mode::Choreo, StorePolicy::Writable));
  runtime::Engine& engine = opened->engine();
  runtime::pml::EncodedSchema enc = runtime::pml::encode_schema(engine, schema);
  print_layout(enc);
  if (store::DiskStore* disk = opened->disk()) {
    // In a fresh engine every message of the encoding (the implicit BOS aside) was computed or loaded.
    const int loaded = runtime::pml::encoded_tokens(engine, enc) - enc.n_computed;
    const int written = runtime::pml::persist_schema(engine, enc, tag);
    std::printf("store %s: %d tokens computed, %d loaded from the store; %d entries written (tag %s)\n",
                disk->dir().c_str(), enc.n_computed, loaded, written, store::key_hex(tag).c_str());
  }
  if (opened->redis()) {
    const kv::TierStats t = engine.tier_stats();
    fmt::print("redis {}: {} pieces written, {} loaded ({} tokens)\n", o.engine.redis, t.t3.writes, t.t3.hits,
               t.t3.load_tokens);
  }
  if (!prompt) return;
  runtime::pml::ServeOptions serve;
  serve.sampling.temperature = o.temperature;
  serve.sampling.seed = o.seed;
  serve.max_tokens = o.max_tokens;
  runtime::pml::ServeResult r = runtime::pml::serve_prompt(engine, enc, *prompt, serve);
  const std::string& text = r.decode.text;
  std::printf("%s\n", (isatty(STDOUT_FILENO) ? escape_for_terminal(text) : text).c_str());
  std::fprintf(stderr,
               "prompt: %d cached tokens reused, %zu parts encoded fresh, header %zu tokens; ttft %.1f ms, "
               "%zu tokens generated (%s)\n",
               r.n_cached_tokens, r.prefills.size(), r.plan.header.size(), r.decode.stats.ttft_ms,
               r.decode.generated.size(), r.decode.stop_reason.c_str());
}

}  // namespace

void register_encode(CLI::App& app) {
  auto o = std::make_shared<EncodeOptions>();
  CLI::App* cmd = app.add_subcommand("encode", "encode a PML schema's modules ahead of time (docs/pml.md)");
  cmd->add_option("schema", o->schema_path, "PML schema file")->required();
  cmd->add_option("-p,--prompt", o->prompt,
                  "also serve this PML prompt (<prompt schema=\"...\">...</prompt>)");
  cmd->add_option("--prompt-file", o->prompt_file, "also serve the PML prompt in this file")
      ->excludes("--prompt");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "tokens to generate for the prompt (default 128)")
      ->check(at_least(1));
  cmd->add_option("--temp", o->temperature, "sampling temperature for the prompt (default 0 = greedy)")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("-s,--seed", o->seed, "sampling seed");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache |
                         EngineFlags::kRedis | EngineFlags::kStore);
  cmd->callback([o] { run_encode(*o); });
}

}  // namespace choreo::cli
