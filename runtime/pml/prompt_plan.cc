#include "runtime/pml/prompt_plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dsl/expr/source.h"

namespace choreo::runtime::pml {

std::vector<std::pair<int, model::Token>> PromptPlan::positioned_tokens() const {
  std::vector<std::pair<int, model::Token>> out;
  for (const PromptPart& p : parts)
    for (size_t i = 0; i < p.tokens.size(); ++i) out.push_back({p.start_pos + int(i), p.tokens[i]});
  for (size_t i = 0; i < header.size(); ++i) out.push_back({header_pos + int(i), header[i]});
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

namespace {

class Planner {
 public:
  Planner(const Layout& layout, const model::Model& model) : layout_(layout), model_(model), vocab_(model.vocab()) {}

  PromptPlan plan(const dsl::pml::Prompt& prompt) {
    if (prompt.schema != layout_.schema_name)
      throw InputError(fmt::format("the prompt names schema '{}' but the schema given is '{}'", prompt.schema,
                                   layout_.schema_name),
                       "write <prompt schema=\"" + layout_.schema_name + "\">, or load the schema it names",
                       prompt.where);
    previous_role_ = layout_.last_role;
    walk(prompt.body, -1);
    schema_parts();
    text_parts();
    choose_header(prompt);
    plan_.included_modules.assign(included_.begin(), included_.end());
    return std::move(plan_);
  }

 private:
  /// Imports, arguments and uncached text, in prompt order; `scope` is the importing module (-1: the top).
  void walk(const std::vector<dsl::pml::PromptNode>& body, int scope) {
    for (const dsl::pml::PromptNode& n : body) {
      if (auto* t = std::get_if<dsl::pml::Text>(&n.value)) {
        texts_.push_back({text_tokens(vocab_, t->text, t->space_before), t->where});
      } else if (auto* r = std::get_if<dsl::pml::RoleMark>(&n.value)) {
        role(*r);
      } else if (auto* im = std::get_if<dsl::pml::Import>(&n.value)) {
        int m = resolve(*im, scope);
        arguments(*im, m);
        walk(im->body, m);
      }
    }
  }

  void role(const dsl::pml::RoleMark& mark) {
    if (model_.chat_format() == model::ChatFormat::None)
      throw InputError(fmt::format("<{}> needs a model with a chat template; {} has none", mark.role,
                                   model_.file().path()),
                       "remove the role tags, or use an instruct model", mark.where);
    std::string text;
    if (mark.closing) {
      if (!open_suffixes_.empty()) {
        text = open_suffixes_.back();
        open_suffixes_.pop_back();
      }
    } else {
      model::TurnAffixes turn = model::turn_affixes_after(model_.chat_format(), mark.role, previous_role_);
      previous_role_ = mark.role;
      open_suffixes_.push_back(turn.suffix);
      text = turn.prefix;
    }
    texts_.push_back({vocab_.tokenize(text, false, true), mark.where});
  }

  int resolve(const dsl::pml::Import& im, int scope) {
    const std::vector<int>& candidates = scope < 0 ? layout_.top_modules : layout_.modules[scope].children;
    std::vector<std::string> names;
    for (int m : candidates) {
      if (layout_.modules[m].name == im.name) return claim(m, im);
      names.push_back(layout_.modules[m].name);
    }
    std::string where = scope < 0 ? fmt::format("schema '{}'", layout_.schema_name)
                                  : fmt::format("module '{}'", layout_.modules[scope].path);
    std::string hint = names.empty() ? fmt::format("{} has no modules to import here", where)
                                     : fmt::format("{} offers: {}", where, fmt::join(names, ", "));
    for (const ModuleLayout& m : layout_.modules)
      if (m.name == im.name) {
        hint = fmt::format("'{}' is nested: import it inside its parents, as in the path {}", im.name, m.path);
        break;
      }
    throw InputError(dsl::expr::with_suggestion(fmt::format("no module '{}' in {}", im.name, where), im.name, names), hint,
                     im.where);
  }

  int claim(int m, const dsl::pml::Import& im) {
    if (!included_.insert(m).second)
      throw InputError(fmt::format("module '{}' is imported twice", layout_.modules[m].path),
                       "import each module once", im.where);
    int u = layout_.modules[m].union_index;
    if (u >= 0) {
      if (auto [it, fresh] = union_choice_.emplace(u, m); !fresh)
        throw InputError(fmt::format("'{}' and '{}' are members of one union", layout_.modules[it->second].name,
                                     layout_.modules[m].name),
                         "union members share their positions: import one of them", im.where);
    }
    return m;
  }

  void arguments(const dsl::pml::Import& im, int m) {
    const ModuleLayout& ml = layout_.modules[m];
    for (const dsl::pml::Argument& a : im.arguments) {
      int slot = -1;
      std::vector<std::string> names;
      for (int s : ml.slots) {
        names.push_back(layout_.pieces[s].parameter);
        if (layout_.pieces[s].parameter == a.name) slot = s;
      }
      if (slot < 0)
        throw InputError(dsl::expr::with_suggestion(fmt::format("module '{}' has no parameter '{}'", ml.path, a.name), a.name,
                                               names),
                         names.empty() ? fmt::format("'{}' takes no arguments", ml.name)
                                       : fmt::format("its parameters: {}", fmt::join(names, ", ")),
                         a.where);
      const Piece& p = layout_.pieces[slot];
      std::vector<model::Token> tokens = text_tokens(vocab_, a.value, p.space_before);
      if (int(tokens.size()) > p.n_positions)
        throw InputError(fmt::format("argument {}=\"{}\" is {} tokens, longer than parameter '{}' of {} tokens",
                                     a.name, a.value, tokens.size(), a.name, p.n_positions),
                         "shorten the argument or raise the parameter's length= in the schema", a.where);
      arguments_[slot] = std::move(tokens);
    }
  }

  bool included(const Piece& p) const { return p.module < 0 || included_.count(p.module) > 0; }

  void schema_parts() {
    std::vector<int> order(layout_.pieces.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return layout_.pieces[a].start_pos < layout_.pieces[b].start_pos; });
    rightmost_ = layout_.first_pos;
    for (int i : order) {
      const Piece& p = layout_.pieces[i];
      if (!included(p)) continue;
      rightmost_ = std::max(rightmost_, p.start_pos + p.n_positions);
      PromptPart part;
      part.start_pos = p.start_pos;
      part.label = p.module < 0 ? "schema" : layout_.modules[p.module].path;
      if (p.kind == Piece::Kind::Slot) {
        part.label += "." + p.parameter;
        if (auto a = arguments_.find(i); a != arguments_.end()) {
          if (a->second.empty()) continue;  // an empty argument leaves the slot a gap
          part.kind = PromptPart::Kind::Fresh;
          part.tokens = a->second;
          plan_.parts.push_back(std::move(part));
          continue;
        }
        if (!p.scaffold_text) continue;  // no argument: the reserved positions stay a gap
      }
      part.kind = p.cached ? PromptPart::Kind::Cached : PromptPart::Kind::Fresh;
      part.piece = i;
      part.tokens = p.tokens;
      plan_.parts.push_back(std::move(part));
    }
  }

  void text_parts() {
    int pos = rightmost_;
    for (auto& [tokens, where] : texts_) {
      if (tokens.empty()) continue;
      PromptPart part;
      part.kind = PromptPart::Kind::Fresh;
      part.start_pos = pos;
      part.label = "text";
      pos += int(tokens.size());
      part.tokens = std::move(tokens);
      plan_.parts.push_back(std::move(part));
      ++n_text_parts_;
    }
  }

  /// The decode's header is the last uncached text; without any, the last token of the last part.
  void choose_header(const dsl::pml::Prompt& prompt) {
    if (plan_.parts.empty())
      throw InputError("the prompt is empty: it imports nothing and has no text, and its schema has no text of its own",
                       "import a module or write some text", prompt.where);
    PromptPart& last = plan_.parts.back();
    if (n_text_parts_ > 0) {
      plan_.header = std::move(last.tokens);
      plan_.header_pos = last.start_pos;
      plan_.parts.pop_back();
      return;
    }
    plan_.header = {last.tokens.back()};
    plan_.header_pos = last.start_pos + int(last.tokens.size()) - 1;
    last.tokens.pop_back();
    if (last.tokens.empty()) plan_.parts.pop_back();
  }

  const Layout& layout_;
  const model::Model& model_;
  const model::Vocab& vocab_;
  PromptPlan plan_;
  std::set<int> included_;
  std::map<int, int> union_choice_;
  std::map<int, std::vector<model::Token>> arguments_;
  std::vector<std::pair<std::vector<model::Token>, SourceLocation>> texts_;
  std::string previous_role_;
  std::vector<std::string> open_suffixes_;
  int rightmost_ = 0;
  int n_text_parts_ = 0;
};

}  // namespace

PromptPlan plan_prompt(const Layout& layout, const dsl::pml::Prompt& prompt, const model::Model& model) {
  return Planner(layout, model).plan(prompt);
}

}  // namespace choreo::runtime::pml
