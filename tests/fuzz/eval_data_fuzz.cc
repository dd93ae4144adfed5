// libFuzzer target for the files `choreo eval` reads (runtime/eval/dataset, runtime/eval/results): any bytes,
// read as each data format (MATH, LongBench, MuSiQue, plain jsonl), by format detection, and as a results
// file, must load or throw an InputError naming the file at a line inside it — never crash, hang, leak or
// throw anything else. A loaded dataset's rows have unique ids and lines inside the file. The bytes go
// through a file in /dev/shm (else the temp dir), as the loaders read paths. Some inputs are generated deep or
// large (fuzz_common.h, expand()): rows nesting lists or objects far past the value limit, many rows.
// With CHOREO_FUZZ_SEED_DIR set, start-up writes one seed per format there (scripts/fuzz.sh).

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>

#include "common/error.h"
#include "runtime/eval/dataset.h"
#include "runtime/eval/results.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace choreo::eval;

const std::string& scratch_path() {
  static const std::string path = [] {
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    if (const char* seeds = std::getenv("CHOREO_FUZZ_SEED_DIR")) {
      const std::filesystem::path s(seeds);
      std::ofstream(s / "seed_math") << R"({"problem": "What is $1+1$?", "solution": "It is $\boxed{2}$.", )"
                                        R"("answer": "2", "subject": "Algebra", "level": "Level 1", "unique_id": "a/1"})"
                                        "\n";
      std::ofstream(s / "seed_longbench") << R"({"input": "Who?", "context": "Ann wrote it.", "answers": ["Ann"], )"
                                             R"("length": 3, "dataset": "qasper", "language": "en", "all_classes": null, "_id": "x1"})"
                                             "\n";
      std::ofstream(s / "seed_musique") << R"([{"question": "Where?", "answers": ["Paris", "paris"], )"
                                           R"("ctxs": [{"title": "P", "text": "Paris is in France."}]}])";
      std::ofstream(s / "seed_results") << R"({"id": "r0", "mode": "choreo", "prediction": "2", "extracted": "2", )"
                                           R"("gold": ["2"], "score": 1, "metric": "math", "ttft_ms": 1.5, "e2e_ms": 2, )"
                                           R"("tokens_generated": 1, "tokens_computed": 3, "tokens_reused": 0, )"
                                           R"("extra": {"line": 1, "decodes_xxh3": "0123456789abcdef"}})"
                                           "\n";
    }
    return (dir / ("choreo-eval-data-fuzz-" + std::to_string(::getpid()) + ".jsonl")).string();
  }();
  return path;
}

using choreo::fuzz::line_count;

void check_error(const choreo::InputError& e, int lines) {
  const choreo::SourceLocation& where = e.where();
  if (where.file != scratch_path() || where.line < 0 || where.line > lines || where.col < 0) __builtin_trap();
  volatile size_t sink = e.render().size();
  (void)sink;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  return choreo::fuzz::mutate(
      data, size, max_size, seed,
      {{"{\"problem\": ", "[", "", "]", ", \"answer\": \"1\"}\n"},
       {"{\"problem\": \"p\", \"answer\": \"1\", \"x\": ", "{\"a\": ", "1", "}", "}\n"},
       {"[{\"question\": \"q\", \"answers\": [\"a\"], \"ctxs\": ", "[", "", "]", "}]"},
       {"{\"id\": \"r0\", \"mode\": \"choreo\", \"extra\": ", "[", "", "]", "}\n"},
       {"", "{\"problem\": \"p\", \"answer\": \"1\"}\n", "", "", ""}});
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  const std::string text =
      choreo::fuzz::expand(std::string_view(reinterpret_cast<const char*>(data), size), 256 << 10);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  const int lines = line_count(text);
  const std::optional<DataFormat> formats[] = {std::nullopt, DataFormat::math, DataFormat::longbench,
                                               DataFormat::musique, DataFormat::jsonl};
  for (const std::optional<DataFormat>& format : formats) {
    try {
      const Dataset d = load_dataset(path, format);
      std::set<std::string> ids;
      for (const Row& row : d.rows) {
        if (!ids.insert(row.id).second) __builtin_trap();
        if (row.line < 1 || row.line > lines) __builtin_trap();
      }
    } catch (const choreo::InputError& e) {
      check_error(e, lines);
    }
  }
  try {
    const ResultsFile r = read_results(path);
    if (r.rows.size() != r.lines.size()) __builtin_trap();
    for (int line : r.lines)
      if (line < 1 || line > lines) __builtin_trap();
  } catch (const choreo::InputError& e) {
    check_error(e, lines);
  }
  return 0;
}
