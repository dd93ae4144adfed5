#pragma once
// PML (Prompt Cache's Prompt Markup Language, DESIGN.md §4) as parsed: schemas of modules, unions and
// parameters, and prompts that import them. Text is already under the whitespace rule of docs/pml.md: each
// run collapsed, trimmed, entities decoded, with `space_before` saying whether whitespace separated it from
// the text before it. Nothing here depends on a model; runtime/pml tokenises and places it.

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"

namespace choreo::dsl::pml {

/// Positions a `<parameter>` reserves when it has no `length` attribute.
inline constexpr int kDefaultParameterLength = 16;

/// A run of text, after the whitespace rule.
struct Text {
  std::string text;
  bool space_before = false;
  SourceLocation where;
};

/// `<parameter name length scaffold>`: `length` token positions filled by a prompt's argument.
struct Parameter {
  std::string name;
  int length = kDefaultParameterLength;
  std::optional<std::string> scaffold;  // text that fills the slot while the schema is encoded
  bool space_before = false;            // an argument is spaced like text written at the tag
  SourceLocation where;
};

/// `<system>`, `<user>`, `<assistant>`: where a chat turn opens or closes (a self-closing tag only opens).
struct RoleMark {
  std::string role;
  bool closing = false;
  SourceLocation where;
};

struct Node;

/// `<module name cache src>`: reusable text, encoded once at its schema position.
struct Module {
  std::string name;
  bool cache = true;  // cache="false": encoded per request instead of ahead of time
  std::vector<Node> body;
  SourceLocation where;
};

/// `<union scaffold>`: alternatives sharing one start position; as long as its longest member.
struct Union {
  std::vector<Module> members;
  std::optional<std::string> scaffold;  // the member the rest of the schema is encoded over (else none)
  SourceLocation where;
};

/// An item of a schema or module body.
struct Node {
  std::variant<Text, Parameter, RoleMark, Module, Union> value;
};

/// A parsed `<schema name>` document.
struct Schema {
  std::string name;
  std::string file;  // where it was read from (error locations); "" for text
  std::vector<Node> body;
  SourceLocation where;
};

/// `name="value"` on an import: the argument of a parameter (value under the whitespace rule).
struct Argument {
  std::string name;
  std::string value;
  SourceLocation where;
};

struct PromptNode;

/// `<module-name arg="..."> nested imports </module-name>` in a prompt.
struct Import {
  std::string name;
  std::vector<Argument> arguments;
  std::vector<PromptNode> body;
  SourceLocation where;
};

/// An item of a prompt: uncached text, a chat-turn mark, or an import.
struct PromptNode {
  std::variant<Text, RoleMark, Import> value;
};

/// A parsed `<prompt schema="...">`.
struct Prompt {
  std::string schema;
  std::vector<PromptNode> body;
  SourceLocation where;
};

}  // namespace choreo::dsl::pml
