#pragma once
// Runs the reference tools in tests/reference (llama.cpp through llama-cpp-python) with the reference Python
// ($CHOREO_PYTHON, which scripts/test.sh points at setup.sh's venv; else python3). A missing Python or package
// fails the test with a hint.

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo::testing {

/// llama.cpp's answer for one prompt.
struct ReferenceRun {
  std::vector<int32_t> tokens, greedy;
  std::vector<float> logits;
};

inline std::string python_exe() {
  const char* p = std::getenv("CHOREO_PYTHON");
  return p && *p ? p : "python3";
}

inline std::vector<uint8_t> base64_decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    int v = val(c);
    if (v < 0) continue;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t((acc >> bits) & 0xFF));
    }
  }
  return out;
}

/// A file of the source tree (tests/reference/...), found through $CHOREO_SOURCE_DIR.
inline std::filesystem::path source_file(const std::string& rel) {
  const char* src = std::getenv("CHOREO_SOURCE_DIR");
  std::filesystem::path p = std::filesystem::path(src ? src : ".") / rel;
  REQUIRE_MESSAGE(std::filesystem::exists(p), "missing ", p.string(), " (set CHOREO_SOURCE_DIR)");
  return p;
}

/// The differential test's SmolLM2 prompts (tests/reference/smollm2_prompts.json, also read by
/// tests/reference/llama_self_consistency.py).
inline std::vector<std::string> smollm2_prompts() {
  return nlohmann::json::parse(std::ifstream(source_file("tests/reference/smollm2_prompts.json")))
      .get<std::vector<std::string>>();
}

/// Runs tests/reference/`script` with the reference Python and `arguments` (each quoted), reading stdin from
/// `input` when given, with its stdout and stderr in files under `dir`; returns its stdout. A failure fails
/// the test with the script's stderr and a hint.
inline std::string run_reference_script(const std::string& script, const std::vector<std::string>& arguments,
                                        const std::filesystem::path& dir, const std::filesystem::path& input = {}) {
  const auto quoted = [](const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  std::string cmd = python_exe() + " " + quoted(source_file("tests/reference/" + script).string());
  for (const std::string& a : arguments) cmd += " " + quoted(a);
  if (!input.empty()) cmd += " < " + quoted(input.string());
  cmd += " > " + quoted((dir / "stdout.txt").string()) + " 2> " + quoted((dir / "stderr.txt").string());
  const int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, script, " failed (", cmd, "): ", read_file(dir / "stderr.txt"),
                  "\nhint: run scripts/setup.sh (installs llama-cpp-python) and set CHOREO_PYTHON to its python");
  return read_file(dir / "stdout.txt");
}

/// A model converted to F32 by llama.cpp's quantize tool (tests/reference/llama_dequantize.py), in a scratch
/// directory removed with this object.
class DequantizedModel {
 public:
  explicit DequantizedModel(const std::string& model) : path_(dir_.path / "model-f32.gguf") {
    run_reference_script("llama_dequantize.py", {model, path_.string()}, dir_.path);
  }
  std::string path() const { return path_.string(); }

 private:
  ScratchDir dir_;
  std::filesystem::path path_;
};

/// SmolLM2-135M-Instruct (the default model) with its weights converted to F32 (DequantizedModel): converted
/// once per run of the test binary, on first use, and shared by the tests that need it (a conversion takes
/// seconds).
inline const std::string& smollm2_f32_path() {
  static const DequantizedModel file(require_file(default_model()));
  static const std::string path = file.path();
  return path;
}

/// Asks llama.cpp for every prompt's tokens, greedy continuation (n_predict tokens) and final logits.
/// `type_k` / `type_v`: llama.cpp's KV cache types (ggml type ids; f32 by default). `loras`: LoRA adapter
/// files with their scales, applied together (llama.cpp's --lora-scaled).
inline std::vector<ReferenceRun> llama_cpp_reference(const std::string& model, const std::vector<std::string>& prompts,
                                                     int n_predict, int type_k = 0, int type_v = 0,
                                                     const std::vector<std::pair<std::string, float>>& loras = {}) {
  ScratchDir dir;
  nlohmann::json adapters = nlohmann::json::array();
  for (const auto& [path, scale] : loras) adapters.push_back({path, scale});
  const nlohmann::json req = {{"model", model},   {"prompts", prompts}, {"n_predict", n_predict},
                              {"threads", 2},     {"type_k", type_k},   {"type_v", type_v},
                              {"loras", adapters}};
  std::ofstream(dir.path / "req.json") << req.dump();
  const nlohmann::json out = nlohmann::json::parse(run_reference_script("llama_ref.py", {}, dir.path, dir.path / "req.json"));
  std::vector<ReferenceRun> runs;
  for (const auto& r : out["results"]) {
    ReferenceRun run;
    run.tokens = r["tokens"].get<std::vector<int32_t>>();
    run.greedy = r["greedy"].get<std::vector<int32_t>>();
    std::vector<uint8_t> bytes = base64_decode(r["logits_b64"].get<std::string>());
    run.logits.resize(bytes.size() / 4);
    std::memcpy(run.logits.data(), bytes.data(), run.logits.size() * 4);
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace choreo::testing
