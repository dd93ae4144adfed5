// The scripts find choreo's cache where the binary does (issue 42, finding 12): scripts/compare_binaries.sh
// looked for the default model under $HOME/.cache only, so scripts/test.sh stopped with "model ... is
// missing" for a user with XDG_CACHE_HOME set, where setup.sh had put it. Now every script takes its cache
// paths from scripts/cache_paths.sh (shell) or scripts/choreo_cache.py (Python), and those agree with
// common/paths.cc.

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"

namespace choreo {
namespace {

namespace fs = std::filesystem;

fs::path source_root() {
  const char* source = std::getenv("CHOREO_SOURCE_DIR");
  return source ? source : fs::current_path();
}

/// Whether a line of a script spells the cache directory itself: $XDG_CACHE_HOME, ~/.cache, $HOME/.cache
/// (also ${HOME} and "$HOME"/), with or without a path after it, anything/.cache/..., or Path.home() / ".cache".
bool spells_cache_dir(const std::string& line) {
  static const std::regex spelled(R"(XDG_CACHE_HOME|(\$\{?HOME\}?"?|~)/\.cache\b|\.cache/|["']\.cache["'])");
  return std::regex_search(line, spelled);
}

TEST_CASE("scripts: the cache-directory pattern catches every spelling, a path after it or not") {
  // The pattern once required a '/' after ".cache", so `$HOME/.cache` and `~/.cache` at the end of a word passed.
  for (const char* line : {R"(cache="$HOME/.cache")", "cache=$HOME/.cache", R"(d="${HOME}/.cache")", R"(d="$HOME"/.cache)",
                           "d=~/.cache", R"(os.path.expanduser("~/.cache"))", "ls ~/.cache/choreo",
                           R"(model="$HOME/.cache/choreo/models/m.gguf")", R"(Path.home() / ".cache")",
                           R"(os.environ.get("XDG_CACHE_HOME"))", "x=$XDG_CACHE_HOME"}) {
    CAPTURE(line);
    CHECK(spells_cache_dir(line));
  }
  for (const char* line : {R"(source "$ROOT/scripts/cache_paths.sh")", R"(model="$CHOREO_CACHE/models")",
                           "CMAKE_CXX_COMPILER_LAUNCHER=ccache", "d=$HOME/.cached", R"(venv = choreo_cache.venv())"}) {
    CAPTURE(line);
    CHECK_FALSE(spells_cache_dir(line));
  }
}

TEST_CASE("scripts: none spells choreo's cache directory itself, the two files that resolve it excepted") {
  const fs::path scripts = source_root() / "scripts";
  REQUIRE_MESSAGE(fs::exists(scripts / "cache_paths.sh"), "set CHOREO_SOURCE_DIR to the source tree");
  int n_scripts = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(scripts)) {
    const fs::path& path = entry.path();
    const std::string name = path.filename().string();
    if (path.extension() != ".sh" && path.extension() != ".py") continue;
    if (name == "cache_paths.sh" || name == "choreo_cache.py") continue;
    ++n_scripts;
    std::ifstream in(path);
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      const size_t first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line[first] == '#') continue;  // comments may say where things go
      CHECK_MESSAGE(!spells_cache_dir(line), name, ":", number, ": ", line);
    }
  }
  CHECK(n_scripts > 20);
}

TEST_CASE("scripts: cache_paths.sh and choreo_cache.py resolve the default model as the binary does") {
  testing::ScratchDir scratch;
  const fs::path scripts = source_root() / "scripts";
  const std::string binary = testing::choreo_binary();
  // Directories that do not exist: the binary names the model it could not open.
  const std::vector<std::vector<std::string>> environments = {
      {"XDG_CACHE_HOME=" + (scratch.path / "xdg").string(), "HOME=" + (scratch.path / "home").string()},
      {"XDG_CACHE_HOME=", "HOME=" + (scratch.path / "home").string()},  // empty counts as unset
  };
  for (std::vector<std::string> env : environments) {
    CAPTURE(env[0]);
    env.push_back("CHOREO_MODEL=");
    const testing::ProcessOptions options{.timeout_seconds = 60, .env = env};
    const testing::ProcessResult choreo =
        testing::run_process(binary, {"tokenize", "-p", "hi"}, scratch.path, options);
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(choreo.err, m, std::regex(R"(error: (\S+\.gguf): cannot open)")),
                    choreo.err);
    const std::string expected = m[1];
    CHECK(expected.find(scratch.path.string()) == 0);

    const testing::ProcessResult shell =
        testing::run_process("/bin/bash",
                             {"-c", "source \"$0\" && printf '%s' \"$CHOREO_DEFAULT_MODEL\"",
                              (scripts / "cache_paths.sh").string()},
                             scratch.path, options);
    CHECK(shell.exit_code == 0);
    CHECK(shell.out == expected);

    const testing::ProcessResult python = testing::run_process(
        "/usr/bin/python3", {"-B", (scripts / "choreo_cache.py").string()}, scratch.path, options);
    CHECK(python.exit_code == 0);
    CHECK(python.out.substr(python.out.find('\n') + 1) == expected + "\n");
  }
}

}  // namespace
}  // namespace choreo
