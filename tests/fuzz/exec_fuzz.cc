// libFuzzer target for the calls files of `choreo exec` (runtime/exec/calls: JSONL parsing and validation,
// tokenisation, the chat template, the static context check): any bytes must give a validated script or an
// InputError located in the file (line within the text, a column where one is given) — never a crash,
// hang, leak or other exception. Nothing is executed. The model is stories260K, from
// $CHOREO_SHARED/models (else $CHOREO_SOURCE_DIR/../shared/models); its chat template is llama2's. Some inputs
// are generated deep or large (fuzz_common.h, expand()): JSON nested far past the value limit, many lines.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/engine/engine.h"
#include "runtime/exec/calls.h"
#include "runtime/model/llama.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

const choreo::model::Model& model() {
  static std::unique_ptr<choreo::kernels::Backend> backend = choreo::kernels::make_cpu_backend(1);
  static std::unique_ptr<choreo::model::Model> loaded = [] {
    try {
      return choreo::model::Model::load((choreo::fuzz::shared_dir() / "models" / "stories260K.gguf").string(),
                                        *backend);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exec_fuzz: cannot load stories260K: %s (set CHOREO_SHARED)\n", e.what());
      std::abort();
    }
  }();
  return *loaded;
}

using choreo::fuzz::line_count;

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return choreo::fuzz::mutate(
      data, size, max_size, seed,
      {{"{\"op\":\"prefill\",\"id\":\"a\",\"text\":\"x\",\"parents\":", "[", "", "]", "}\n"},
       {"{\"op\":\"prefill\",\"id\":\"a\",\"text\":\"x\",\"extra\":", "{\"a\":", "1", "}", "}\n"},
       {"", "[", "{\"op\":\"prefill\",\"id\":\"a\",\"text\":\"x\"}", "]", "\n"},
       {"", "{\"op\":\"prefill\",\"text\":\"x\"}\n", "", "", ""}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 256 << 10);
  const int lines = line_count(text);
  for (choreo::runtime::Mode mode : {choreo::runtime::Mode::Choreo, choreo::runtime::Mode::Naive}) {
    std::istringstream in(text);
    try {
      const choreo::exec::CallScript script = choreo::exec::parse_calls(in, "fuzz.jsonl", choreo::runtime::ModelSet(model()), mode, 1);
      if (static_cast<int>(script.lines.size()) > lines) __builtin_trap();
    } catch (const choreo::InputError& e) {
      const choreo::SourceLocation& where = e.where();
      if (where.file != "fuzz.jsonl" || where.line < 1 || where.line > lines || where.col < 0) __builtin_trap();
      volatile size_t sink = e.render().size();
      (void)sink;
    }
  }
  return 0;
}
