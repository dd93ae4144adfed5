// choreo: run multi-agent LLM workflows without encoding the same text twice.
// Errors a user causes print once, here, and exit 2; environment failures exit 1.

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "runtime/common/error.h"

// OpenMP threads should spin between the ~200 parallel regions of a decode step when they have the cores to
// themselves: with libgomp's default policy a waiting thread sleeps, and tg128 of a 1B model fell from 27.6 to
// 16 tok/s. On a machine that is already busy, spinning threads steal the cores the other threads need and
// everything stalls (SmolLM2 tg32 at load 7: 22 tok/s spinning, 92 tok/s sleeping; a madpar run took 7 min
// instead of 19 s). So the policy follows the 1-minute load average: active when at most half the cores are
// busy, passive otherwise. libgomp reads OMP_WAIT_POLICY once, when it is loaded, so the process re-executes
// itself with it set; a policy the user sets is kept.
static void choose_openmp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  setenv("OMP_WAIT_POLICY", load <= 0.5 * double(cores > 0 ? cores : 1) ? "active" : "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure; then run with the default policy
}

int main(int argc, char** argv) {
  choose_openmp_wait_policy(argv);
  CLI::App app{
      "choreo — LLM inference on a global KV cache of messages (Prompt Choreography), CPU backend.\n"
      "Workflows: run, check, profile, eval; Prompt Cache: encode, cache. See README.md and docs/."};
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
