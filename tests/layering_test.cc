// The layering of issue 10, checked on the source tree: scripts/include_graph.sh finds no cycle between
// folders, the arrows that were cycles stay one-way, common/ includes nothing of choreo's above it, store/
// includes neither kv/ nor model/ (issue 38), and PCRE2 has one wrapper.

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

std::filesystem::path source_root() {
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  return source ? source : std::filesystem::current_path();
}

TEST_CASE("layering: the folders include each other without cycles") {
  const std::filesystem::path script = source_root() / "scripts" / "include_graph.sh";
  REQUIRE_MESSAGE(std::filesystem::exists(script), "set CHOREO_SOURCE_DIR to the source tree");
  testing::ScratchDir scratch;
  const testing::ProcessResult r =
      testing::run_process("/bin/bash", {script.string(), source_root().string()}, scratch.path, {.timeout_seconds = 60});
  INFO(r.out, r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("cycle:") == std::string::npos);
  CHECK(r.out.find("runtime/exec -> runtime/eval") == std::string::npos);
  CHECK(r.out.find("runtime/kv -> runtime/model") == std::string::npos);
  CHECK(r.out.find("runtime/eval -> runtime/exec") != std::string::npos);  // the direction that remains
  CHECK(r.out.find("runtime/model -> runtime/kv") != std::string::npos);
  for (const char* lower : {"common ->", "dsl -> runtime/", "kernels -> runtime/", "dsl -> cli", "kernels -> dsl"})
    CHECK_MESSAGE(r.out.find(std::string("\n") + lower) == std::string::npos, lower);
  CHECK(r.out.rfind("common ->", 0) != 0);
  // Issue 38: the stores (T2, T3) see entries, page ids and the backend, never the page pool or the model.
  for (const char* arrow : {"runtime/store -> runtime/kv", "runtime/store -> runtime/model", "runtime/store -> runtime/engine"})
    CHECK_MESSAGE(r.out.find(std::string("\n") + arrow) == std::string::npos, arrow);
  CHECK(r.out.find("\nruntime/engine -> runtime/store") != std::string::npos);  // not vacuous: the arrows are read
}

TEST_CASE("layering: the include graph reads CUDA sources (.cu, .cuh) as well as .cc and .h") {
  // A tree of its own, where only CUDA sources include upwards: the arrows must appear.
  testing::ScratchDir tree;
  const auto write = [&](const std::string& file, const std::string& text) {
    std::filesystem::create_directories((tree.path / file).parent_path());
    std::ofstream(tree.path / file) << text;
  };
  write("kernels/cuda/a.cu", "#include \"kernels/backend.h\"\n#include \"runtime/engine/engine.h\"\n");
  write("kernels/cuda/kernels/b.cuh", "  #  include \"dsl/ast.h\"\n");
  write("kernels/c.cc", "#include \"common/error.h\"\n");
  write("common/error.h", "#pragma once\n");
  const std::filesystem::path script = source_root() / "scripts" / "include_graph.sh";
  const testing::ProcessResult r =
      testing::run_process("/bin/bash", {script.string(), tree.path.string()}, tree.path, {.timeout_seconds = 60});
  INFO(r.out, r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("kernels -> runtime/engine (1)") != std::string::npos);
  CHECK(r.out.find("kernels -> dsl (1)") != std::string::npos);
  CHECK(r.out.find("kernels -> common (1)") != std::string::npos);  // the control: .cc files are still read
}

TEST_CASE("layering: only common/regex.cc includes pcre2.h") {
  std::vector<std::string> includers;
  for (const char* folder : {"cli", "common", "dsl", "kernels", "runtime", "include"}) {
    const std::filesystem::path dir = source_root() / folder;
    REQUIRE(std::filesystem::is_directory(dir));
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      if (text.str().find("#include <pcre2.h>") != std::string::npos)
        includers.push_back(std::filesystem::relative(entry.path(), source_root()).string());
    }
  }
  CHECK(includers == std::vector<std::string>{"common/regex.cc"});
}

}  // namespace
}  // namespace choreo
