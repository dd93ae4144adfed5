#pragma once
// The whitespace rule of PML (docs/pml.md): inside a text run every sequence of spaces, tabs and line breaks
// becomes one space and the run is trimmed; whether whitespace separated a run from the text before it is
// kept as `space_before` (the tokenisation step writes it as a leading space where the vocabulary needs one).
// Characters written as references (&#10;, &#32;) are not whitespace for this rule: they are kept as written.

#include <optional>
#include <string>
#include <string_view>

#include "dsl/pml/ast.h"

namespace choreo::dsl::pml {

/// Walks the text of one document in order and applies the whitespace rule.
class Spacing {
 public:
  /// A raw text run (entities not yet decoded): the Text to emit, or nullopt when the run is only whitespace.
  /// `leading_offset` receives the byte offset in `raw` of the first non-whitespace character.
  std::optional<Text> take(std::string_view raw, size_t* leading_offset = nullptr);
  /// For text that is not XML (a src= file): trimmed, inner whitespace kept as written, no entities decoded.
  std::optional<Text> take_literal(std::string_view raw);
  /// For an element standing where text could (a parameter): whether a space precedes it; then no space is
  /// pending until more whitespace is seen.
  bool take_pending();
  /// At the start of a document and of a chat turn (and after one): whitespace is not a separator until
  /// some text or parameter has been seen, so a turn's content never starts with a space.
  void start_fresh() {
    pending_ = false;
    fresh_ = true;
  }

  /// The walk's state, saved and restored around union members (each starts where the union starts).
  struct State {
    bool pending = false;
    bool fresh = false;
  };
  State state() const { return {pending_, fresh_}; }
  void set_state(State s) {
    pending_ = s.pending;
    fresh_ = s.fresh;
  }

 private:
  std::optional<Text> take_impl(std::string_view raw, bool decode, size_t* leading_offset);
  bool pending_ = false;
  bool fresh_ = false;
};

/// Collapses every whitespace sequence of `text` to one space and trims both ends.
std::string collapse_whitespace(std::string_view text);

}  // namespace choreo::dsl::pml
