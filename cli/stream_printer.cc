#include "cli/stream_printer.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace choreo::cli {

namespace {

/// Bytes at the end of `text` that form an incomplete UTF-8 sequence.
size_t incomplete_utf8_tail(const std::string& text) {
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

StreamPrinter::StreamPrinter(const model::Vocab& vocab, std::function<std::string(const std::string&)> colour,
                             FILE* out)
    : vocab_(vocab), colour_(std::move(colour)), out_(out), escape_(isatty(fileno(out)) != 0) {}

void StreamPrinter::write(Stream& s, std::string_view bytes) {
  const std::string escaped = escape_ ? s.escaper.feed(bytes) : std::string();
  const std::string_view shown = escape_ ? std::string_view(escaped) : bytes;
  std::fwrite(shown.data(), 1, shown.size(), out_);
}

void StreamPrinter::start(const std::vector<exec::DecodeBranch>& branches) {
  streams_.clear();
  for (const exec::DecodeBranch& b : branches) streams_.push_back({b.name, b.agent, b.stop});
  live_ = 0;
  if (!streams_.empty()) header(streams_[0]);
}

void StreamPrinter::header(const Stream& s) {
  const std::string who = s.agent.empty() ? s.name : fmt::format("{} ({})", s.name, s.agent);
  const std::string c = colour_(s.agent);
  if (c.empty())
    fmt::print(out_, "── {}\n", who);
  else
    fmt::print(out_, "\033[1;{}m── {}\033[0m\n", c, who);
}

void StreamPrinter::flush(Stream& s) {
  size_t safe = s.text.size();
  if (!s.done) {
    // Hold back what might still become a stop string or complete a UTF-8 character.
    for (const std::string& stop : s.stop) {
      if (stop.empty()) continue;
      const size_t at = s.text.find(stop);
      if (at != std::string::npos) safe = std::min(safe, at);
      safe = std::min(safe, s.text.size() - std::min(s.text.size(), stop.size() - 1));
    }
    safe -= std::min(safe, incomplete_utf8_tail(s.text.substr(0, safe)));
  }
  if (safe > s.printed) {
    write(s, std::string_view(s.text).substr(s.printed, safe - s.printed));
    s.printed = safe;
  }
  if (s.done && escape_) {
    const std::string rest = s.escaper.finish();
    std::fwrite(rest.data(), 1, rest.size(), out_);
  }
  std::fflush(out_);
}

void StreamPrinter::token(size_t branch, model::Token token) {
  if (branch >= streams_.size() || vocab_.is_eog(token)) return;
  Stream& s = streams_[branch];
  s.text += vocab_.token_to_piece(token);
  if (branch == live_) flush(s);
}

void StreamPrinter::finished(const exec::MessageRecord& record) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    Stream& s = streams_[i];
    if (s.done || s.name != record.name) continue;
    // The final text is authoritative; what was printed is always a prefix of it.
    s.text = record.text;
    s.printed = std::min(s.printed, s.text.size());
    s.done = true;
    if (i == live_) advance();
    return;
  }
}

void StreamPrinter::advance() {
  while (live_ < streams_.size()) {
    Stream& s = streams_[live_];
    flush(s);
    if (!s.done) return;
    fmt::print(out_, "\n\n");
    ++live_;
    if (live_ < streams_.size()) header(streams_[live_]);
  }
  std::fflush(out_);
}

}  // namespace choreo::cli
