#include "runtime/eval/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace choreo::eval {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long total = std::lround(seconds);
  const long hours = total / 3600, minutes = total / 60 % 60, secs = total % 60;
  if (hours > 0) return fmt::format("{}:{:02}:{:02}", hours, minutes, secs);
  return fmt::format("{}:{:02}", minutes, secs);
}

double rate_per_s(const ProgressState& state) {
  if (state.done == 0 || !(state.elapsed_s > 0)) return 0;
  return static_cast<double>(state.done) / state.elapsed_s;
}

double eta_s(const ProgressState& state) {
  const double rate = rate_per_s(state);
  if (!(rate > 0)) return -1;
  const size_t left = state.total > state.done ? state.total - state.done : 0;
  return static_cast<double>(left) / rate;
}

namespace {

int percent_done(const ProgressState& state) {
  if (state.total == 0) return 100;
  return static_cast<int>(100 * std::min(state.done, state.total) / state.total);
}

/// Mean score x100 of the successful runs, or "--" before the first.
std::string mean_score(const ProgressState& state) {
  const size_t succeeded = state.done - std::min(state.failed, state.done);
  if (succeeded == 0) return "--";
  return fmt::format("{:.1f}", 100.0 * state.score_sum / static_cast<double>(succeeded));
}

std::string rate_text(const ProgressState& state) {
  const double rate = rate_per_s(state);
  if (!(rate > 0)) return "--/s";
  return rate >= 0.1 ? fmt::format("{:.2f}/s", rate) : fmt::format("{:.1f}s each", 1 / rate);
}

}  // namespace

std::string render_bar(const ProgressState& state, int bar_width) {
  const size_t width = static_cast<size_t>(std::max(bar_width, 1));
  const size_t filled = state.total == 0 ? width : width * std::min(state.done, state.total) / state.total;
  std::string text = "[" + std::string(filled, '#') + std::string(width - filled, '-') + "]";
  text += fmt::format("  {}/{}  {}%  {}  ETA {}  mean {}", state.done, state.total, percent_done(state),
                      rate_text(state), format_duration(eta_s(state)), mean_score(state));
  if (state.failed > 0) text += fmt::format("  {} failed", state.failed);
  if (!state.mode.empty()) text += "  " + state.mode;
  return text;
}

std::string render_line(const ProgressState& state) {
  std::string text =
      fmt::format("eval: {}/{} ({}%), {}, ETA {}, mean score {}", state.done, state.total,
                  percent_done(state), rate_text(state), format_duration(eta_s(state)), mean_score(state));
  if (!state.mode.empty()) text += ", mode " + state.mode;
  if (state.failed > 0) text += fmt::format(", {} failed", state.failed);
  return text;
}

Progress::Progress(size_t total, bool terminal, double interval_s)
    : terminal_(terminal), interval_s_(interval_s) {
  state_.total = total;
}

std::string Progress::start_mode(const std::string& mode, double now_s) {
  state_.mode = mode;
  return show(now_s, true);
}

std::string Progress::finished(bool succeeded, double score, double now_s) {
  ++state_.done;
  if (succeeded)
    state_.score_sum += score;
  else
    ++state_.failed;
  return show(now_s, state_.done >= state_.total);
}

std::string Progress::close() {
  if (!bar_open_) return "";
  bar_open_ = false;
  return "\n";
}

std::string Progress::show(double now_s, bool force) {
  if (start_s_ < 0) start_s_ = now_s;
  state_.elapsed_s = std::max(0.0, now_s - start_s_);
  if (terminal_) {
    bar_open_ = true;
    return "\r" + render_bar(state_) + "\033[K";
  }
  if (!force && last_line_s_ >= 0 && now_s - last_line_s_ < interval_s_) return "";
  last_line_s_ = now_s;
  return render_line(state_) + "\n";
}

}  // namespace choreo::eval
