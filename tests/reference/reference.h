#pragma once
// Runs llama.cpp (through llama-cpp-python, tests/reference/llama_ref.py) to get reference tokens,
// greedy continuations and logits. A missing Python or package fails the test with a hint.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

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

/// A model converted to F32 by llama.cpp's quantize tool (tests/reference/llama_dequantize.py), in a temporary
/// directory removed with this object.
class DequantizedModel {
 public:
  explicit DequantizedModel(const std::string& model) {
    dir_ = std::filesystem::temp_directory_path() /
           ("choreo-f32-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
    std::filesystem::create_directories(dir_);
    path_ = dir_ / "model-f32.gguf";
    std::string cmd = python_exe() + " " + source_file("tests/reference/llama_dequantize.py").string() + " " +
                      model + " " + path_.string() + " > " + (dir_ / "log.txt").string() + " 2>&1";
    int rc = std::system(cmd.c_str());
    std::ifstream log_in(dir_ / "log.txt");
    std::string log((std::istreambuf_iterator<char>(log_in)), {});
    REQUIRE_MESSAGE(rc == 0, "llama.cpp's F32 conversion failed (", cmd, "): ", log,
                    "\nhint: run scripts/setup.sh (installs llama-cpp-python) and set CHOREO_PYTHON to its python");
  }
  ~DequantizedModel() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  DequantizedModel(const DequantizedModel&) = delete;
  DequantizedModel& operator=(const DequantizedModel&) = delete;
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path dir_, path_;
};

/// Asks llama.cpp for every prompt's tokens, greedy continuation (n_predict tokens) and final logits.
inline std::vector<ReferenceRun> llama_cpp_reference(const std::string& model, const std::vector<std::string>& prompts,
                                                     int n_predict) {
  std::filesystem::path script = source_file("tests/reference/llama_ref.py");
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("choreo-ref-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  nlohmann::json req = {{"model", model}, {"prompts", prompts}, {"n_predict", n_predict}, {"threads", 2}};
  std::ofstream(dir / "req.json") << req.dump();
  std::string cmd = python_exe() + " " + script.string() + " < " + (dir / "req.json").string() + " > " +
                    (dir / "out.json").string() + " 2> " + (dir / "err.txt").string();
  int rc = std::system(cmd.c_str());
  std::ifstream err_in(dir / "err.txt");
  std::string err((std::istreambuf_iterator<char>(err_in)), {});
  REQUIRE_MESSAGE(rc == 0, "llama.cpp reference failed (", cmd, "): ", err,
                  "\nhint: run scripts/setup.sh (installs llama-cpp-python) and set CHOREO_PYTHON to its python");
  nlohmann::json out = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  std::filesystem::remove_all(dir);
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
