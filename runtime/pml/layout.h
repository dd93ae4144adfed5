#pragma once
// A PML schema tokenised and placed (DESIGN.md §4): every text run, parameter slot and chat-turn affix
// becomes a *piece* — one engine message at a fixed start position — owned by the module it sits in (or by
// the schema, whose own text every prompt includes). Union members share their union's start position; a
// union is as long as its longest member. Tokenisation boundaries are those of docs/pml.md: each piece is
// tokenised on its own, without BOS.

#include <string>
#include <string_view>
#include <vector>

#include "dsl/pml/ast.h"
#include "runtime/model/llama.h"

namespace choreo::runtime::pml {

/// One engine message of a schema.
struct Piece {
  enum class Kind { Text, Slot };
  Kind kind = Kind::Text;
  std::vector<model::Token> tokens;  // Text: the run's tokens; Slot: what fills the slot while encoding
  int start_pos = 0;
  int n_positions = 0;               // positions reserved: tokens.size() for text, the length for a slot
  int module = -1;                   // owning module (index into Layout::modules); -1: the schema's own text
  bool cached = true;                // false inside a cache="false" module: encoded per request
  int scaffold_last = -1;            // the last of the earlier pieces it attends to when encoded (scaffold_of)
  std::string parameter;             // Slot: the parameter's name
  bool space_before = false;         // Slot: an argument is tokenised as text written after a space
  bool scaffold_text = false;        // Slot: `tokens` is the parameter's scaffold= text (kept without argument)
  SourceLocation where;
};

/// A module's place in the layout.
struct ModuleLayout {
  std::string name;
  std::string path;        // names from the top, joined by '/': "travel-plan/overseas/tokyo"
  int parent = -1;         // enclosing module, -1 at the top
  int union_index = -1;    // the union it is a member of, -1 if none
  int start_pos = 0;
  int n_positions = 0;
  bool cached = true;
  std::vector<int> pieces;    // its own pieces (nested modules own theirs)
  std::vector<int> slots;     // its parameters' pieces
  std::vector<int> children;  // nested modules and union members, in order
  SourceLocation where;
};

/// A union's place: members share `start_pos`; `n_positions` is the longest member's.
struct UnionLayout {
  int start_pos = 0;
  int n_positions = 0;
  std::vector<int> members;
  int scaffold_member = -1;  // the member later pieces are encoded over, -1: none
};

/// A schema laid out for one model.
struct Layout {
  std::string schema_name;
  std::vector<Piece> pieces;          // in document order
  std::vector<ModuleLayout> modules;  // in document order
  std::vector<UnionLayout> unions;
  std::vector<int> top_modules;       // modules (and union members) directly in the schema
  int first_pos = 0;                  // 1 after the implicit BOS, else 0
  int end_pos = 0;                    // one past the last reserved position
  std::string last_role;              // the role of the schema's last chat turn ("" if none)
};

/// The earlier cached pieces `piece` attends to when encoded, in position order: its scaffold_last, that
/// piece's scaffold_last, and so on back to the first. Every piece's scaffold is the scaffold of the piece
/// before it in this chain plus that piece, so the layout holds one index per piece instead of a list each
/// (a list each is quadratic in the number of pieces).
std::vector<int> scaffold_of(const Layout& layout, int piece);

/// Tokens of one text run under the tokenisation rule of docs/pml.md: tokenised alone, no BOS, no special
/// tokens parsed; with a byte-level BPE vocabulary `space_before` writes a leading space, while SentencePiece
/// vocabularies begin every piece with their own word-boundary space.
std::vector<model::Token> text_tokens(const model::Vocab& vocab, std::string_view text, bool space_before);

/// The token that fills a parameter slot while its module is encoded: "<unk>" if the vocabulary has it, else
/// EOS.
model::Token placeholder_token(const model::Vocab& vocab);

/// Tokenises and places a schema for `model`. Throws InputError (at the element) for a role tag on a model
/// without chat template, or a parameter's scaffold= text longer than its length.
Layout lay_out(const dsl::pml::Schema& schema, const model::Model& model);

}  // namespace choreo::runtime::pml
