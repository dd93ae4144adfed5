// Budgets hold in the process, not only in the allocators' books (issue 11): `choreo exec` encoding far more
// KV than its T0 budget keeps its peak RSS within what a tiny run needs plus T0 + T1 plus a stated margin.

#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "tests/cli_process.h"
#include "tests/scratch_dir.h"
#include "tests/test_paths.h"

namespace choreo {
namespace {

/// A prefill call of about `words` words, different for each `i`.
std::string prefill_line(int i, int words) {
  static const char* kWords[] = {"river", "stone", "lamp", "window", "garden", "cloud", "bridge", "letter",
                                 "music", "forest", "harbor", "candle", "winter", "market", "silver", "engine"};
  std::string text = "Story " + std::to_string(i) + ":";
  for (int w = 0; w < words; ++w) text += std::string(" ") + kWords[(i * 7 + w * 5 + w / 16) % 16];
  return "{\"op\":\"prefill\",\"id\":\"p" + std::to_string(i) + "\",\"text\":\"" + text + "\"}\n";
}

TEST_CASE("tiers RSS: encoding 10x its T0 budget, the process stays within a tiny run's RSS + T0 + T1 + 64 MiB") {
  testing::ScratchDir dir;
  const std::string model = testing::require_file(testing::default_model());
  const std::string tiny = (dir.path / "tiny.jsonl").string(), big = (dir.path / "big.jsonl").string();
  std::ofstream(tiny) << prefill_line(0, 8);
  {
    std::ofstream out(big);
    for (int i = 0; i < 12; ++i) out << prefill_line(i, 900);  // ~1000 tokens each: ~45 MiB of f32 KV each
  }
  auto run = [&](const std::string& calls, std::vector<std::string> extra) {
    std::vector<std::string> args = {"exec", "-m", model, calls};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::ProcessResult r = testing::run_process(testing::choreo_binary(), args, dir.path);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const long base_kib = run(tiny, {}).max_rss_kib;
  constexpr long kT0Mib = 48, kT1Mib = 32, kMarginMib = 64;
  const testing::ProcessResult r =
      run(big, {"--cache-mib", std::to_string(kT0Mib), "--host-cache-mib", std::to_string(kT1Mib)});
  const long limit_kib = base_kib + (kT0Mib + kT1Mib + kMarginMib) * 1024;
  MESSAGE("peak RSS: tiny run " << base_kib / 1024 << " MiB, 12 x ~1000-token prefills under T0 " << kT0Mib
                                << " + T1 " << kT1Mib << " MiB: " << r.max_rss_kib / 1024 << " MiB (limit "
                                << limit_kib / 1024 << " MiB; the KV written is about 540 MiB)");
  CHECK(r.max_rss_kib <= limit_kib);
}

}  // namespace
}  // namespace choreo
