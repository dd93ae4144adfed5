// `choreo generate`: a plain KV-cache run, printing only the continuation on stdout (like llama.cpp's
// llama-simple/llama-cli -no-cnv); timings go to stderr. On a terminal the continuation is escaped
// (common/terminal_text.h); a pipe or file gets its exact bytes.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "common/error.h"
#include "common/terminal_text.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/sampler.h"
#include "runtime/model/session.h"

namespace choreo::cli {

namespace {

struct GenerateOptions {
  std::string prompt, system;
  int n_predict = -1;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int top_k = 40;
  int64_t seed = -1;
  bool chat = false;
  bool no_bos = false;
  EngineFlags engine;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The prompt's tokens: -p as given, or with --chat in the model's chat template (after --system).
std::vector<model::Token> prompt_tokens(const GenerateOptions& o, const model::Model& m) {
  std::string text = o.prompt;
  if (o.chat) {
    if (m.chat_format() == model::ChatFormat::None)
      throw InputError("--chat: this model has no known chat template",
                       "supported families: chatml, llama3, llama2; drop --chat for plain completion");
    std::vector<model::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", o.prompt});
    text = model::render_chat(m.chat_format(), msgs, true);
  }
  std::vector<model::Token> tokens = m.vocab().tokenize(text, !o.no_bos, /*parse_special=*/true);
  if (tokens.empty()) throw InputError("the prompt is empty", "pass some text with -p");
  return tokens;
}

void run_generate(const GenerateOptions& o) {
  const std::shared_ptr<runtime::LoadedModels> loaded = runtime::load_models(o.engine.model_options());
  const model::Model& m = loaded->model();
  const model::Vocab& vocab = m.vocab();
  const std::vector<model::Token> tokens = prompt_tokens(o, m);

  kv::PagePool pool(m.backend(), o.engine.kv_layout(m), o.engine.t0_bytes());
  model::Session session(m, pool);
  session.set_lora(&loaded->base_lora);
  model::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.seed = o.seed >= 0 ? uint64_t(o.seed) : std::random_device{}();
  model::Sampler sampler(sp);

  const int n_ctx = m.config().n_ctx_train;
  int n_predict = o.n_predict < 0 ? n_ctx - int(tokens.size()) : o.n_predict;
  if (int(tokens.size()) + n_predict > n_ctx) n_predict = std::max(0, n_ctx - int(tokens.size()));

  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  session.eval(tokens, &logits);
  double prompt_s = seconds_since(t0);

  const bool terminal = isatty(STDOUT_FILENO) != 0;
  TerminalEscaper escaper;
  auto print = [](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto t1 = std::chrono::steady_clock::now();
  int n_generated = 0;
  for (int i = 0; i < n_predict; ++i) {
    model::Token next = sampler.sample(logits);
    if (vocab.is_eog(next)) break;
    const std::string piece = vocab.token_to_piece(next);
    print(terminal ? escaper.feed(piece) : piece);
    ++n_generated;
    if (i + 1 < n_predict) session.eval(std::span<const model::Token>(&next, 1), &logits);
  }
  double gen_s = seconds_since(t1);
  if (terminal) print(escaper.finish());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s (%.1f tok/s)\n",
               tokens.size(), prompt_s, tokens.size() / std::max(prompt_s, 1e-9), n_generated, gen_s,
               n_generated / std::max(gen_s, 1e-9));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate a continuation of a prompt (plain KV-cache run)");
  cmd->add_option("-p,--prompt", o->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "tokens to generate (-1: until end of generation)")
      ->check(at_least(-1));
  cmd->add_option("--temp", o->temperature, "temperature (0 = greedy)")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--top-k", o->top_k, "top-k sampling (0 = off)")->check(at_least(0));
  cmd->add_option("-s,--seed", o->seed, "random seed (-1 = random)");
  cmd->add_flag("--chat", o->chat, "wrap the prompt as a user turn in the model's chat template");
  cmd->add_option("--system", o->system, "system message for --chat");
  cmd->add_flag("--no-bos", o->no_bos, "do not add the BOS token");
  o->engine.add(*cmd, EngineFlags::kModel | EngineFlags::kLora | EngineFlags::kKv | EngineFlags::kCache);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace choreo::cli
