#pragma once
// The progress display of `choreo eval`: a bar with rate and ETA redrawn in place on a terminal, plain
// periodic lines otherwise (a log file, a cluster job's output). Time is passed in, never read here, so the
// text shown for given counts and times is a plain function that tests can check.

#include <cstddef>
#include <string>

namespace choreo::eval {

/// Where an evaluation run stands.
struct ProgressState {
  size_t done = 0;       // (row, mode) runs finished in this session, failed ones included
  size_t total = 0;      // (row, mode) runs this session does (rows resumed from the file excluded)
  size_t failed = 0;     // runs that stopped with an error
  double score_sum = 0;  // sum of the scores (0..1) of the successful runs
  std::string mode;      // the mode running now
  double elapsed_s = 0;  // since the first run started
};

/// "0:07", "1:05", "2:03:44"; "--:--" for a negative or non-finite duration.
std::string format_duration(double seconds);

/// Runs per second so far (0 before any finished or when no time has passed).
double rate_per_s(const ProgressState& state);
/// Seconds left at the rate so far; negative when unknown (nothing finished yet).
double eta_s(const ProgressState& state);

/// One terminal line, e.g. `[######------------------]  10/40  25%  0.50/s  ETA 1:00  mean 40.0  prefix`.
std::string render_bar(const ProgressState& state, int bar_width = 24);
/// One log line, e.g. `eval: 10/40 (25%), 0.50/s, ETA 1:00, mean score 40.0, mode prefix`.
std::string render_line(const ProgressState& state);

/// Decides what to print and when: on a terminal every change redraws the bar in place (`\r`, erase to the
/// end of the line); otherwise a line at most every `interval_s` seconds, and always for the last run.
class Progress {
 public:
  Progress(size_t total, bool terminal, double interval_s = 10);

  /// A new mode starts at `now_s` (seconds on any clock, the same for every call). Returns text to print.
  std::string start_mode(const std::string& mode, double now_s);
  /// A run finished (score in 0..1 when it succeeded). Returns text to print, possibly empty.
  std::string finished(bool succeeded, double score, double now_s);
  /// The run is over: the terminal bar gets its line break. Returns text to print, possibly empty.
  std::string close();

  const ProgressState& state() const { return state_; }

 private:
  std::string show(double now_s, bool force);

  ProgressState state_;
  bool terminal_;
  double interval_s_;
  double start_s_ = -1;
  double last_line_s_ = -1;
  bool bar_open_ = false;
};

}  // namespace choreo::eval
