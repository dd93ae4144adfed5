// libFuzzer target for the calls files of `choreo exec` (runtime/exec/calls: JSONL parsing and validation,
// tokenisation, the chat template, the static context check): any bytes must give a validated script or an
// InputError located in the file (line within the text, a column where one is given) — never a crash,
// hang, leak or other exception. Nothing is executed. The model is stories260K, from
// $CHOREO_SHARED/models (else $CHOREO_SOURCE_DIR/../shared/models); its chat template is llama2's.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "runtime/common/error.h"
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const int lines = line_count(text);
  for (choreo::runtime::Mode mode : {choreo::runtime::Mode::Choreo, choreo::runtime::Mode::Naive}) {
    std::istringstream in(text);
    try {
      const choreo::exec::CallScript script = choreo::exec::parse_calls(in, "fuzz.jsonl", model(), mode, 1);
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
