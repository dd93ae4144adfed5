// libFuzzer target for the files `choreo finetune train` reads (runtime/train/finetune, runtime/train/checkpoint):
// any bytes, read as a traces file and, when they start like a GGUF file, as a checkpoint for a LoRA on
// stories260K, must load or throw an InputError naming the file (at a line inside it, for traces), never
// crash, hang, leak or throw anything else. Traces that load are then teacher-forced through a small
// choreographed workflow on stories260K (train::trace_messages), which must either give a well-formed graph
// (parents before readers, no targets or one per token, tokens in the vocabulary) or throw an InputError. Some inputs
// are generated large (fuzz_common.h, expand()). With CHOREO_FUZZ_SEED_DIR set, start-up writes a real traces
// file and a real checkpoint there (scripts/fuzz.sh). The model comes from $CHOREO_SHARED/models.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"
#include "dsl/workflow_parser.h"
#include "kernels/backend.h"
#include "runtime/engine/engine.h"
#include "runtime/kv/page_pool.h"
#include "runtime/model/llama.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/finetune.h"
#include "runtime/train/trainer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/train/train_workflows.h"

namespace {

using namespace choreo;

const train::CheckpointKey kKey{.rank = 4, .alpha = 8.0f, .targets = "q,v,down", .seed = 7, .lr = 1e-4, .traces_xxh3 = 0x1234};

struct Setup {
  std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  std::unique_ptr<model::Model> model;
  std::unique_ptr<dsl::Workflow> workflow;
  std::unique_ptr<train::FrozenModel> frozen;
  train::CheckpointKey key = kKey;
  std::string path;
};

train::LoraParams<float> fresh_lora(const Setup& s) {
  return train::LoraParams<float>::init(*s.frozen, {model::LoraTarget::Q, model::LoraTarget::V, model::LoraTarget::Down},
                                        s.key.rank, s.key.alpha, s.key.seed);
}

const Setup& setup() {
  static const Setup s = [] {
    Setup s;
    try {
      s.model = model::Model::load((fuzz::shared_dir() / "models" / "stories260K.gguf").string(), *s.backend);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "finetune_fuzz: cannot load stories260K: %s (set CHOREO_SHARED)\n", e.what());
      std::abort();
    }
    s.workflow = std::make_unique<dsl::Workflow>(dsl::parse_workflow(testing::kReorderedWorkflow, "reordered.yaml"));
    s.frozen = std::make_unique<train::FrozenModel>(train::FrozenModel::dequantise(*s.model));
    s.key.model_fingerprint = s.model->fingerprint();
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    s.path = (dir / ("choreo-finetune-fuzz-" + std::to_string(::getpid()))).string();
    if (const char* seeds = std::getenv("CHOREO_FUZZ_SEED_DIR")) {
      const std::filesystem::path d(seeds);
      std::ofstream(d / "seed_traces")
          << R"({"line": 1, "inputs": {}, "params": {}, "max_steps": 1000, )"
             R"("calls": [{"name": "ans", "generated": [403, 407, 410]}, {"name": "more", "generated": [5, 6]}]})"
             "\n"
             R"({"line": 2, "inputs": {}, "params": {}, "max_steps": 1000, )"
             R"("calls": [{"name": "ans", "generated": [1, 2, 3, 4, 5, 6]}, {"name": "more", "generated": []}]})"
             "\n";
      train::LoraParams<float> lora = fresh_lora(s);
      train::TrainState state;
      state.adam = train::AdamW(lora.size());
      state.epochs_done = 1;
      train::write_checkpoint((d / "seed_checkpoint").string(), s.key, lora, state);
    }
    return s;
  }();
  return s;
}

void check_error(const InputError& e, const std::string& path, int lines) {
  const SourceLocation& where = e.where();
  if (where.file != path || where.line < 0 || where.line > lines || where.col < 0) __builtin_trap();
  volatile size_t sink = e.render().size();
  (void)sink;
}

void fuzz_traces(const Setup& s, const std::string& text) {
  const int lines = fuzz::line_count(text);
  std::vector<train::Trace> traces;
  try {
    traces = train::read_traces(s.path, s.model->config().n_vocab);
  } catch (const InputError& e) {
    check_error(e, s.path, lines);
    return;
  }
  if (traces.empty()) __builtin_trap();
  for (size_t t = 0; t < traces.size() && t < 2; ++t) {
    kv::PagePool pool(*s.backend, s.model->kv_layout(32), size_t(8) << 20);
    runtime::Engine engine(*s.model, pool, runtime::Mode::Choreo);
    std::vector<train::GraphMessage> messages;
    try {
      messages = train::trace_messages(*s.workflow, engine, traces[t]);
    } catch (const InputError&) {
      continue;
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const train::GraphMessage& m = messages[i];
      // Targets: none (a message no decode generated), or one per token.
      if ((!m.targets.empty() && m.targets.size() != m.tokens.size()) || m.start_pos < 0) __builtin_trap();
      for (int32_t tok : m.tokens)
        if (tok < 0 || tok >= s.model->config().n_vocab) __builtin_trap();
      for (const train::GraphMessage::Parent& p : m.parents)
        if (p.message < 0 || size_t(p.message) >= i || p.offset < 0) __builtin_trap();
    }
  }
}

void fuzz_checkpoint(const Setup& s) {
  train::LoraParams<float> lora = fresh_lora(s);
  train::TrainState state;
  try {
    train::read_checkpoint(s.path, s.key, lora, state);
  } catch (const InputError& e) {
    if (e.where().file != s.path && e.message().find(s.path) == std::string::npos) __builtin_trap();
    return;
  }
  if (state.adam.m().size() != lora.size() || state.adam.v().size() != lora.size() || state.epochs_done < 0)
    __builtin_trap();
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return fuzz::mutate(
      data, size, max_size, seed,
      {{"{\"line\": 1, \"inputs\": {}, \"params\": {}, \"max_steps\": 9, \"calls\": [{\"name\": \"ans\", \"generated\": ",
        "[", "", "]", "}]}\n"},
       {"", "{\"line\": 1, \"inputs\": {}, \"params\": {}, \"max_steps\": 9, \"calls\": [{\"name\": \"ans\", \"generated\": [1]}]}\n",
        "", "", ""},
       {"{\"line\": 1, \"inputs\": {}, \"params\": {}, \"max_steps\": 9, \"calls\": [{\"name\": \"ans\", \"generated\": [",
        "7, ", "8", "", "]}]}\n"}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = setup();
  const std::string text = fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 256 << 10);
  std::ofstream(s.path, std::ios::binary | std::ios::trunc) << text;
  if (text.starts_with("GGUF"))
    fuzz_checkpoint(s);
  else
    fuzz_traces(s, text);
  return 0;
}
