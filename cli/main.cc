// choreo: run multi-agent LLM workflows without encoding the same text twice.
// Errors a user causes print once, here, and exit 2; environment failures exit 1.

#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "runtime/common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"choreo — runs LLM workflows on a global KV cache of messages (CPU backend)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "choreo 0.1.0");
  choreo::cli::register_generate(app);
  choreo::cli::register_tokenize(app);
  choreo::cli::register_model(app);
  choreo::cli::register_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const choreo::InputError& e) {
    std::fputs(e.render().c_str(), stderr);
    return 2;
  } catch (const choreo::RuntimeFailure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
