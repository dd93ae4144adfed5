#include "dsl/pml/schema_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <set>

#include "common/input_file.h"
#include "common/utf8.h"
#include "dsl/pml/whitespace.h"
#include "dsl/pml/xml.h"

namespace choreo::dsl::pml {

bool is_pml_name(std::string_view name) {
  if (name.empty()) return false;
  auto start = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!start(name[0])) return false;
  for (char c : name.substr(1))
    if (!start(c) && !(c >= '0' && c <= '9') && c != '.' && c != '-') return false;
  return true;
}

bool is_role_tag(std::string_view tag) { return tag == "system" || tag == "user" || tag == "assistant"; }

namespace {

/// Positions one parameter may reserve (a guard against typos such as length="40000000").
constexpr int kMaxParameterLength = 1 << 16;

class SchemaParser {
 public:
  SchemaParser(const XmlDocument& doc, const std::string& file_name) : doc_(doc) {
    referrer_ = file_name.empty() ? std::filesystem::path("<schema>") : std::filesystem::path(file_name);
  }

  Schema parse() {
    const XmlElement& root = doc_.root;
    if (root.name != "schema")
      throw doc_.error_at(root.offset, fmt::format("expected <schema>, found <{}>", root.name),
                          "a schema file is one <schema name=\"...\"> element (prompts are parsed separately)");
    check_attributes(root, {"name"});
    Schema s;
    s.where = where(root.offset);
    spacing_.start_fresh();
    s.name = required_name(root, "schema");
    std::set<std::string> scope;
    s.body = body(root, scope, nullptr);
    return s;
  }

 private:
  SourceLocation where(size_t offset) const { return doc_.location_at(offset); }

  InputError error_at_attribute(const XmlAttribute& a, std::string message, std::string hint = {}) const {
    return InputError(std::move(message), std::move(hint), a.where);
  }

  void check_attributes(const XmlElement& e, std::initializer_list<std::string_view> allowed) const {
    for (const XmlAttribute& a : e.attributes) {
      bool ok = false;
      std::vector<std::string> names;
      for (std::string_view n : allowed) {
        ok = ok || a.name == n;
        names.emplace_back(n);
      }
      if (!ok) {
        std::string list;
        for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
        throw InputError(expr::with_suggestion(fmt::format("unknown attribute '{}' on <{}>", a.name, e.name), a.name,
                                               names),
                         list.empty() ? fmt::format("<{}> takes no attributes", e.name)
                                      : fmt::format("<{}> takes: {}", e.name, list),
                         a.where);
      }
    }
  }

  std::string required_name(const XmlElement& e, const char* what) const {
    const XmlAttribute* a = e.attribute("name");
    if (!a)
      throw doc_.error_at(e.offset, fmt::format("<{}> has no name", e.name), fmt::format("write <{} name=\"...\">", e.name));
    if (!is_pml_name(a->value))
      throw error_at_attribute(*a, fmt::format("'{}' is not a valid {} name", a->value, what),
                               "names match [A-Za-z_][A-Za-z0-9_.-]*");
    return a->value;
  }

  void claim(std::set<std::string>& scope, const std::string& name, const XmlElement& e, const char* what) const {
    if (!scope.insert(name).second)
      throw InputError(fmt::format("{} '{}' is defined twice in the same scope", what, name),
                       "names must be unique among the modules (and union members) of one schema or module",
                       e.attribute("name")->where);
  }

  /// The children of a schema, module or role body. `parameters` is null outside modules.
  std::vector<Node> body(const XmlElement& parent, std::set<std::string>& scope, std::set<std::string>* parameters) {
    std::vector<Node> out;
    for (const XmlNode& child : parent.children) {
      if (child.is_text) {
        size_t lead = 0;
        if (auto t = spacing_.take(child.text.raw, &lead)) {
          t->where = where(child.text.offset + lead);
          out.push_back({std::move(*t)});
        }
        continue;
      }
      const XmlElement& e = child.element;
      if (e.name == "module") {
        out.push_back({module(e, scope)});
      } else if (e.name == "union") {
        out.push_back({union_of(e, scope)});
      } else if (e.name == "parameter") {
        if (!parameters)
          throw doc_.error_at(e.offset, "<parameter> outside a module",
                              "parameters belong to a module: a prompt fills them when it imports the module");
        out.push_back({parameter(e, *parameters)});
      } else if (is_role_tag(e.name)) {
        if (in_role_)
          throw doc_.error_at(e.offset, fmt::format("<{}> inside another role", e.name),
                              "chat turns do not nest: close the enclosing role first");
        check_attributes(e, {});
        out.push_back({RoleMark{e.name, false, where(e.offset)}});
        spacing_.start_fresh();
        if (!e.self_closing) {
          in_role_ = true;
          for (Node& n : body(e, scope, parameters)) out.push_back(std::move(n));
          in_role_ = false;
          out.push_back({RoleMark{e.name, true, where(e.offset)}});
          spacing_.start_fresh();
        }
      } else {
        static const std::vector<std::string> known = {"module", "union", "parameter", "system", "user", "assistant"};
        throw doc_.error_at(e.offset, expr::with_suggestion(fmt::format("unknown element <{}> in a schema", e.name),
                                                            e.name, known),
                            "schemas contain <module>, <union>, <parameter>, <system>, <user>, <assistant> and text; "
                            "write '<' in text as &lt;");
      }
    }
    return out;
  }

  Module module(const XmlElement& e, std::set<std::string>& scope) {
    check_attributes(e, {"name", "cache", "src"});
    Module m;
    m.where = where(e.offset);
    m.name = required_name(e, "module");
    if (is_role_tag(m.name))
      throw error_at_attribute(*e.attribute("name"), fmt::format("'{}' is a role tag and cannot name a module", m.name),
                               "choose another name: prompts import modules by tag");
    claim(scope, m.name, e, "module");
    if (const XmlAttribute* c = e.attribute("cache")) {
      if (c->value != "true" && c->value != "false")
        throw error_at_attribute(*c, fmt::format("cache=\"{}\" must be \"true\" or \"false\"", c->value));
      m.cache = c->value == "true";
    }
    std::set<std::string> inner_scope, parameters;
    if (const XmlAttribute* src = e.attribute("src")) {
      for (const XmlNode& child : e.children)
        if (!child.is_text || collapse_whitespace(child.text.raw).size() > 0)
          throw doc_.error_at(child.is_text ? child.text.offset : child.element.offset,
                              fmt::format("module '{}' has src=\"{}\" and content of its own", m.name, src->value),
                              "a module takes its text either from src= or from its body, not both");
      if (src->value.empty()) throw error_at_attribute(*src, "src=\"\" names no file");
      // The file must stay inside the schema's directory (or one allowed with --allow-path): a schema from
      // elsewhere must not read /etc/shadow into a prompt, an output or the store.
      std::filesystem::path path;
      try {
        path = confine_path(referrer_, src->value, "src=");
      } catch (const InputError& e) {
        throw error_at_attribute(*src, e.message(), e.hint());
      }
      std::error_code ec;
      if (!std::filesystem::is_regular_file(path, ec))
        throw error_at_attribute(*src, fmt::format("src file '{}' not found", path.string()),
                                 "src= paths are relative to the schema file's directory");
      std::string text = read_input_file(path.string(), "src file", input_policy().file_bytes, Origin::Referred);
      // Its place and byte, but not its line: a src= file is not quoted (it may be anything a schema names).
      if (const size_t bad = find_invalid_text_byte(text); bad != std::string::npos) {
        const int line = 1 + int(std::count(text.begin(), text.begin() + ptrdiff_t(bad), '\n'));
        const std::string what =
            text[bad] == '\0' ? std::string("a NUL byte")
                              : fmt::format("the byte 0x{:02X}, which is not UTF-8", uint8_t(text[bad]));
        throw error_at_attribute(
            *src,
            fmt::format("src file '{}': line {} (byte {} of the file) holds {}", path.string(), line, bad + 1,
                        what),
            "module text must be UTF-8 without NUL bytes, as PML and workflow files are");
      }
      if (auto t = spacing_.take_literal(text)) {
        t->where = SourceLocation{path.string(), 1, 1};
        m.body.push_back({std::move(*t)});
      }
      return m;
    }
    m.body = body(e, inner_scope, &parameters);
    return m;
  }

  Union union_of(const XmlElement& e, std::set<std::string>& scope) {
    check_attributes(e, {"scaffold"});
    Union u;
    u.where = where(e.offset);
    const Spacing::State entry = spacing_.state();
    bool any_end_pending = false;
    for (const XmlNode& child : e.children) {
      if (child.is_text) {
        if (!collapse_whitespace(child.text.raw).empty())
          throw doc_.error_at(child.text.offset + child.text.raw.find_first_not_of(" \t\r\n"),
                              "text directly inside <union>",
                              "a union holds only <module> members; put the text inside one of them");
        continue;
      }
      if (child.element.name != "module")
        throw doc_.error_at(child.element.offset, fmt::format("<{}> directly inside <union>", child.element.name),
                            "a union holds only <module> members");
      spacing_.set_state(entry);
      u.members.push_back(module(child.element, scope));
      any_end_pending = any_end_pending || spacing_.state().pending;
    }
    if (u.members.empty())
      throw doc_.error_at(e.offset, "empty <union>", "a union needs at least one <module> member");
    spacing_.set_state({any_end_pending, false});
    if (const XmlAttribute* s = e.attribute("scaffold")) {
      bool found = false;
      std::vector<std::string> names;
      for (const Module& m : u.members) {
        found = found || m.name == s->value;
        names.push_back(m.name);
      }
      if (!found)
        throw error_at_attribute(
            *s, expr::with_suggestion(fmt::format("scaffold=\"{}\" names no member of this union", s->value), s->value,
                                      names),
            "scaffold= names the member the rest of the schema is encoded over");
      u.scaffold = s->value;
    }
    return u;
  }

  Parameter parameter(const XmlElement& e, std::set<std::string>& parameters) {
    check_attributes(e, {"name", "length", "scaffold"});
    Parameter p;
    p.where = where(e.offset);
    p.name = required_name(e, "parameter");
    if (!parameters.insert(p.name).second)
      throw error_at_attribute(*e.attribute("name"), fmt::format("parameter '{}' is defined twice in one module", p.name));
    for (const XmlNode& child : e.children)
      if (!child.is_text || !collapse_whitespace(child.text.raw).empty())
        throw doc_.error_at(child.is_text ? child.text.offset : child.element.offset,
                            fmt::format("<parameter name=\"{}\"> has content", p.name),
                            "write it self-closing: <parameter name=\"...\" length=\"N\"/>");
    if (const XmlAttribute* l = e.attribute("length")) {
      int value = 0;
      auto [end, ec] = std::from_chars(l->value.data(), l->value.data() + l->value.size(), value);
      if (ec != std::errc() || end != l->value.data() + l->value.size() || value < 1 || value > kMaxParameterLength)
        throw error_at_attribute(*l, fmt::format("length=\"{}\" is not a whole number of tokens in 1..{}", l->value,
                                                 kMaxParameterLength),
                                 "length counts the token positions the parameter reserves");
      p.length = value;
    }
    if (const XmlAttribute* s = e.attribute("scaffold")) p.scaffold = collapse_whitespace(s->value);
    p.space_before = spacing_.take_pending();
    return p;
  }

  const XmlDocument& doc_;
  std::filesystem::path referrer_;  // the schema file: src= paths are confined to its directory
  Spacing spacing_;
  bool in_role_ = false;
};

}  // namespace

Schema parse_schema(std::string_view text, const std::string& file_name) {
  XmlDocument doc = read_xml(text, SourceLocation{file_name.empty() ? "<schema>" : file_name, 1, 1});
  Schema s = SchemaParser(doc, file_name).parse();
  s.file = file_name;
  return s;
}

Schema load_schema(const std::string& path, std::string* bytes, Origin origin) {
  std::string text = read_input_file(path, "schema file", input_policy().file_bytes, origin);
  Schema schema = parse_schema(text, path);
  if (bytes) *bytes = std::move(text);
  return schema;
}

}  // namespace choreo::dsl::pml
