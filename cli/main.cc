// choreo: run multi-agent LLM workflows without encoding the same text twice.
// Errors a user causes print once, here, and exit 2; environment failures exit 1.

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "runtime/common/error.h"

// OpenMP threads must spin between the ~200 parallel regions of a decode step: with libgomp's default
// policy a waiting thread sleeps, and on a busy 2-core machine tg128 of a 1B model fell from 27.6 to 16 tok/s
// (± 9). libgomp reads OMP_WAIT_POLICY once, when it is loaded, so the process re-executes itself with it set.
static void ensure_active_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "active", 1);
  execv("/proc/self/exe", argv);  // returns only on failure; then run with the default policy
}

int main(int argc, char** argv) {
  ensure_active_openmp_wait(argv);
  CLI::App app{
      "choreo — LLM inference on a global KV cache of messages (Prompt Choreography), CPU backend.\n"
      "choreo run executes workflows; check, profile, encode and eval are not built yet."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "choreo 0.1.0");
  choreo::cli::register_generate(app);
  choreo::cli::register_tokenize(app);
  choreo::cli::register_model(app);
  choreo::cli::register_bench(app);
  choreo::cli::register_exec(app);
  choreo::cli::register_run(app);
  choreo::cli::register_encode(app);
  choreo::cli::register_profile(app);
  choreo::cli::register_check(app);
  choreo::cli::register_eval(app);
  choreo::cli::register_cache(app);
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
