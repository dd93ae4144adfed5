#include "dsl/pml/prompt_parser.h"

#include <fmt/format.h>

#include "dsl/pml/schema_parser.h"
#include "dsl/pml/whitespace.h"
#include "dsl/pml/xml.h"

namespace choreo::dsl::pml {

namespace {

class PromptParser {
 public:
  explicit PromptParser(const XmlDocument& doc) : doc_(doc) {}

  Prompt parse() {
    const XmlElement& root = doc_.root;
    if (root.name != "prompt")
      throw doc_.error_at(root.offset, fmt::format("expected <prompt>, found <{}>", root.name),
                          "a prompt is one <prompt schema=\"...\"> element");
    Prompt p;
    p.where = doc_.location_at(root.offset);
    for (const XmlAttribute& a : root.attributes)
      if (a.name != "schema")
        throw InputError(fmt::format("unknown attribute '{}' on <prompt>", a.name), "<prompt> takes: schema", a.where);
    const XmlAttribute* schema = root.attribute("schema");
    if (!schema)
      throw doc_.error_at(root.offset, "<prompt> names no schema", "write <prompt schema=\"schema-name\">");
    p.schema = schema->value;
    p.body = body(root);
    return p;
  }

 private:
  std::vector<PromptNode> body(const XmlElement& parent) {
    std::vector<PromptNode> out;
    for (const XmlNode& child : parent.children) {
      if (child.is_text) {
        size_t lead = 0;
        if (auto t = spacing_.take(child.text.raw, &lead)) {
          t->where = doc_.location_at(child.text.offset + lead);
          out.push_back({std::move(*t)});
        }
        continue;
      }
      const XmlElement& e = child.element;
      if (is_role_tag(e.name)) {
        if (in_role_)
          throw doc_.error_at(e.offset, fmt::format("<{}> inside another role", e.name),
                              "chat turns do not nest: close the enclosing role first");
        if (!e.attributes.empty())
          throw InputError(fmt::format("<{}> takes no attributes", e.name), {}, e.attributes.front().where);
        out.push_back({RoleMark{e.name, false, doc_.location_at(e.offset)}});
        spacing_.start_fresh();
        if (!e.self_closing) {
          in_role_ = true;
          for (PromptNode& n : body(e)) out.push_back(std::move(n));
          in_role_ = false;
          out.push_back({RoleMark{e.name, true, doc_.location_at(e.offset)}});
          spacing_.start_fresh();
        }
        continue;
      }
      if (!is_pml_name(e.name))
        throw doc_.error_at(e.offset, fmt::format("'{}' is not a valid module name", e.name),
                            "names match [A-Za-z_][A-Za-z0-9_.-]*");
      Import im;
      im.name = e.name;
      im.where = doc_.location_at(e.offset);
      for (const XmlAttribute& a : e.attributes) {
        if (!is_pml_name(a.name))
          throw InputError(fmt::format("'{}' is not a valid parameter name", a.name),
                           "names match [A-Za-z_][A-Za-z0-9_.-]*", a.where);
        im.arguments.push_back({a.name, collapse_whitespace(a.value), a.where});
      }
      im.body = body(e);
      out.push_back({std::move(im)});
    }
    return out;
  }

  const XmlDocument& doc_;
  Spacing spacing_;
  bool in_role_ = false;
};

}  // namespace

Prompt parse_prompt(std::string_view text, const SourceLocation& start) {
  SourceLocation origin = start;
  if (origin.file.empty()) origin.file = "<prompt>";
  if (origin.line <= 0) origin.line = 1;
  if (origin.col <= 0) origin.col = 1;
  XmlDocument doc = read_xml(text, origin);
  return PromptParser(doc).parse();
}

}  // namespace choreo::dsl::pml
