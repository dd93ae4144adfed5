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
#include "dsl/pml/prompt_parser.h"
#include "dsl/pml/schema_parser.h"
#include "common/error.h"
#include "common/input_file.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/pml/encode.h"
#include "runtime/pml/serve.h"
#include "runtime/store/cache_dir.h"
#include "runtime/store/disk_store.h"
#include "runtime/store/redis_store.h"
#include "common/terminal_text.h"

namespace choreo::cli {

namespace {

struct EncodeOptions {
  std::string schema_path, model_path, prompt, prompt_file, cache_dir, store_key_file;
  bool no_store = false;
  int n_threads = 0;
  int cache_mib = 4096;
  KvOptions kv;
  LoraOptions lora;
  TierOptions tiers;  // only --redis and --redis-best-effort
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

/// Tokens of the distinct messages the encoding holds (pieces with identical encodings share one message).
int encoded_tokens(const runtime::pml::EncodedSchema& enc, runtime::Engine& engine) {
  std::vector<kv::MessageId> ids;
  for (kv::MessageId id : enc.messages)
    if (id != kv::kNoMessage) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  int tokens = 0;
  for (kv::MessageId id : ids) tokens += int(engine.store().get(id).tokens.size());
  return tokens;
}

/// True when the store holds a usable entry for `key`: header and every page checked (a corrupt page makes
/// the engine recompute the piece, and then the entry must be rewritten).
bool store_holds(runtime::Engine& engine, store::DiskStore& disk, uint64_t key) {
  const store::Compatibility expect{engine.weights_fingerprint(), engine.store().pool().layout()};
  std::optional<store::MappedEntry> entry = disk.open(key, expect);
  if (!entry) return false;
  kv::PageList scratch(engine.store().pool());
  return disk.read_pages(*entry, scratch);
}

/// Saves every piece's encoding that the store does not hold yet; returns how many entries were written.
int persist_pieces(runtime::Engine& engine, store::DiskStore& disk, const runtime::pml::EncodedSchema& enc,
                   uint64_t tag) {
  int written = 0;
  for (kv::MessageId id : enc.messages) {
    if (id == kv::kNoMessage) continue;
    if (store_holds(engine, disk, engine.store().get(id).key)) continue;  // loaded, or written just before
    engine.persist(id, tag);
    ++written;
  }
  return written;
}

void run_encode(EncodeOptions& o) {
  o.tiers.resolve();
  std::string schema_bytes;
  dsl::pml::Schema schema = dsl::pml::load_schema(o.schema_path, &schema_bytes);
  const uint64_t tag = schema_tag(schema_bytes);
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
  // Parse the prompt before the model loads: a typo fails fast.
  std::optional<dsl::pml::Prompt> prompt;
  if (!prompt_text.empty()) prompt = dsl::pml::parse_prompt(prompt_text, prompt_origin);
  LoadedModel lm = load_model(o.model_path, o.n_threads);
  kv::PagePool pool(lm.model->backend(), o.kv.layout(*lm.model), size_t(o.cache_mib) << 20);
  lm.lora = o.lora.load(*lm.model);
  runtime::Engine engine(*lm.model, pool, runtime::Mode::Choreo, 512, &lm.lora);
  std::optional<store::DiskStore> disk;
  if (!o.no_store) {
    disk.emplace(store::resolve_cache_dir(o.cache_dir), true, store::WarningSink{},
                 store::configured_authenticator(o.store_key_file));
    engine.set_disk_store(&*disk);  // prefills look there first; we persist below, with the schema's tag
  }
  // T3: pieces are looked up there after the disk store, and every piece computed is written to it.
  std::unique_ptr<store::RedisStore> redis = open_redis(o.tiers);
  if (redis) engine.set_remote_store(redis.get());
  runtime::pml::EncodedSchema enc = runtime::pml::encode_schema(engine, schema);
  print_layout(enc);
  if (disk) {
    // In a fresh engine every message of the encoding (the implicit BOS aside) was computed or loaded.
    const int loaded = encoded_tokens(enc, engine) - enc.n_computed;
    const int written = persist_pieces(engine, *disk, enc, tag);
    std::printf("store %s: %d tokens computed, %d loaded from the store; %d entries written (tag %s)\n",
                disk->dir().c_str(), enc.n_computed, loaded, written, store::key_hex(tag).c_str());
  }
  if (redis) {
    const kv::TierStats t = engine.tier_stats();
    fmt::print("redis {}: {} pieces written, {} loaded ({} tokens)\n", o.tiers.redis, t.t3_writes, t.t3_hits,
               t.t3_load_tokens);
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
  add_model_options(*cmd, o->model_path, o->n_threads);
  cmd->add_option("-p,--prompt", o->prompt,
                  "also serve this PML prompt (<prompt schema=\"...\">...</prompt>)");
  cmd->add_option("--prompt-file", o->prompt_file, "also serve the PML prompt in this file")
      ->excludes("--prompt");
  cmd->add_option("-n,--max-tokens", o->max_tokens, "tokens to generate for the prompt (default 128)")
      ->check(at_least(1));
  cmd->add_option("--temp", o->temperature, "sampling temperature for the prompt (default 0 = greedy)")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("-s,--seed", o->seed, "sampling seed");
  cmd->add_option("--cache-mib", o->cache_mib, "KV page pool budget in MiB (default 4096)")->check(at_least(1));
  add_kv_options(*cmd, o->kv);
  add_lora_options(*cmd, o->lora);
  add_redis_options(*cmd, o->tiers);
  cmd->add_option(
      "--cache-dir", o->cache_dir,
      "persistent store directory (default: $CHOREO_CACHE_DIR, else the XDG cache; docs/store.md)");
  cmd->add_option("--store-key-file", o->store_key_file,
                  "sign entries written, and require a valid MAC of entries read, with the store key in this "
                  "file (default: $CHOREO_STORE_KEY_FILE; docs/store.md)");
  cmd->add_flag("--no-store", o->no_store, "neither load from nor write to the persistent store");
  cmd->callback([o] { run_encode(*o); });
}

}  // namespace choreo::cli
