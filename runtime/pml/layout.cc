#include "runtime/pml/layout.h"

#include <algorithm>

#include <fmt/format.h>

namespace choreo::runtime::pml {

using dsl::pml::Node;

std::vector<model::Token> text_tokens(const model::Vocab& vocab, std::string_view text, bool space_before) {
  if (vocab.kind() == model::Vocab::Kind::BPE && space_before) {
    std::string spaced = " ";
    spaced += text;
    return vocab.tokenize(spaced, false, false);
  }
  return vocab.tokenize(text, false, false);
}

model::Token placeholder_token(const model::Vocab& vocab) {
  model::Token unk = vocab.find("<unk>");
  if (unk >= 0) return unk;
  return vocab.eos() >= 0 ? vocab.eos() : 0;
}

std::vector<int> scaffold_of(const Layout& layout, int piece) {
  std::vector<int> chain;
  for (int s = layout.pieces[size_t(piece)].scaffold_last; s >= 0; s = layout.pieces[size_t(s)].scaffold_last)
    chain.push_back(s);
  std::reverse(chain.begin(), chain.end());
  return chain;
}

namespace {

/// Where the walk is: the next free position, the last cached piece visible to the next piece (the others
/// are its scaffold), the last role.
struct Cursor {
  int pos = 0;
  int last_visible = -1;
  std::string previous_role;
  std::vector<std::string> open_suffixes;  // suffixes of turns opened and not yet closed
};

class LayoutBuilder {
 public:
  LayoutBuilder(const dsl::pml::Schema& schema, const model::Model& model)
      : schema_(schema), model_(model), vocab_(model.vocab()) {}

  Layout build() {
    layout_.schema_name = schema_.name;
    layout_.first_pos = vocab_.add_bos() && vocab_.bos() >= 0 ? 1 : 0;
    Cursor c;
    c.pos = layout_.first_pos;
    walk(schema_.body, -1, true, c);
    layout_.end_pos = c.pos;
    layout_.last_role = c.previous_role;
    return std::move(layout_);
  }

 private:
  int add_piece(Piece p, int module, bool cached, Cursor& c) {
    p.start_pos = c.pos;
    p.module = module;
    p.cached = cached;
    p.scaffold_last = c.last_visible;
    int index = int(layout_.pieces.size());
    c.pos += p.n_positions;
    if (cached) c.last_visible = index;
    if (module >= 0) {
      layout_.modules[module].pieces.push_back(index);
      if (p.kind == Piece::Kind::Slot) layout_.modules[module].slots.push_back(index);
    }
    layout_.pieces.push_back(std::move(p));
    return index;
  }

  void text_piece(std::vector<model::Token> tokens, const SourceLocation& where, int module, bool cached, Cursor& c) {
    if (tokens.empty()) return;
    Piece p;
    p.n_positions = int(tokens.size());
    p.tokens = std::move(tokens);
    p.where = where;
    add_piece(std::move(p), module, cached, c);
  }

  void role(const dsl::pml::RoleMark& mark, int module, bool cached, Cursor& c) {
    if (model_.chat_format() == model::ChatFormat::None)
      throw InputError(fmt::format("<{}> needs a model with a chat template; {} has none", mark.role,
                                   model_.file().path()),
                       "remove the role tags, or use an instruct model", mark.where);
    if (mark.closing) {
      std::string suffix = c.open_suffixes.empty() ? std::string() : c.open_suffixes.back();
      if (!c.open_suffixes.empty()) c.open_suffixes.pop_back();
      text_piece(vocab_.tokenize(suffix, false, true), mark.where, module, cached, c);
      return;
    }
    model::TurnAffixes turn = model::turn_affixes_after(model_.chat_format(), mark.role, c.previous_role);
    c.previous_role = mark.role;
    c.open_suffixes.push_back(turn.suffix);
    text_piece(vocab_.tokenize(turn.prefix, false, true), mark.where, module, cached, c);
  }

  void parameter(const dsl::pml::Parameter& param, int module, bool cached, Cursor& c) {
    Piece p;
    p.kind = Piece::Kind::Slot;
    p.n_positions = param.length;
    p.parameter = param.name;
    p.space_before = param.space_before;
    p.where = param.where;
    if (param.scaffold && !param.scaffold->empty()) {
      p.tokens = text_tokens(vocab_, *param.scaffold, param.space_before);
      if (int(p.tokens.size()) > param.length)
        throw InputError(fmt::format("the scaffold text of parameter '{}' is {} tokens, longer than its length of {} "
                                     "tokens",
                                     param.name, p.tokens.size(), param.length),
                         "shorten scaffold= or raise length=", param.where);
      p.scaffold_text = true;
    }
    if (p.tokens.empty()) p.tokens.assign(size_t(param.length), placeholder_token(vocab_));
    add_piece(std::move(p), module, cached, c);
  }

  int module(const dsl::pml::Module& m, int parent, int union_index, bool cached, Cursor& c) {
    int index = int(layout_.modules.size());
    ModuleLayout ml;
    ml.name = m.name;
    ml.path = parent >= 0 ? layout_.modules[parent].path + "/" + m.name : m.name;
    ml.parent = parent;
    ml.union_index = union_index;
    ml.start_pos = c.pos;
    ml.cached = cached && m.cache;
    ml.where = m.where;
    layout_.modules.push_back(ml);
    if (parent >= 0) layout_.modules[parent].children.push_back(index);
    else layout_.top_modules.push_back(index);
    walk(m.body, index, cached && m.cache, c);
    layout_.modules[index].n_positions = c.pos - layout_.modules[index].start_pos;
    return index;
  }

  void union_of(const dsl::pml::Union& u, int parent, bool cached, Cursor& c) {
    int index = int(layout_.unions.size());
    layout_.unions.push_back({c.pos, 0, {}, -1});
    Cursor after = c;
    int longest = 0;
    for (const dsl::pml::Module& member : u.members) {
      Cursor mc = c;  // every member starts where the union starts, seeing what precedes the union
      int m = module(member, parent, index, cached, mc);
      layout_.unions[index].members.push_back(m);
      longest = std::max(longest, mc.pos - c.pos);
      if (u.scaffold && *u.scaffold == member.name) {
        layout_.unions[index].scaffold_member = m;
        after = mc;
      }
    }
    layout_.unions[index].n_positions = longest;
    after.pos = c.pos + longest;
    c = std::move(after);
  }

  void walk(const std::vector<Node>& body, int module_index, bool cached, Cursor& c) {
    for (const Node& n : body) {
      if (auto* t = std::get_if<dsl::pml::Text>(&n.value)) {
        text_piece(text_tokens(vocab_, t->text, t->space_before), t->where, module_index, cached, c);
      } else if (auto* p = std::get_if<dsl::pml::Parameter>(&n.value)) {
        parameter(*p, module_index, cached, c);
      } else if (auto* r = std::get_if<dsl::pml::RoleMark>(&n.value)) {
        role(*r, module_index, cached, c);
      } else if (auto* m = std::get_if<dsl::pml::Module>(&n.value)) {
        module(*m, module_index, -1, cached, c);
      } else if (auto* u = std::get_if<dsl::pml::Union>(&n.value)) {
        union_of(*u, module_index, cached, c);
      }
    }
  }

  const dsl::pml::Schema& schema_;
  const model::Model& model_;
  const model::Vocab& vocab_;
  Layout layout_;
};

}  // namespace

Layout lay_out(const dsl::pml::Schema& schema, const model::Model& model) {
  return LayoutBuilder(schema, model).build();
}

}  // namespace choreo::runtime::pml
