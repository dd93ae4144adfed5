#pragma once
// The XML subset PML is written in, read into a located element tree. Elements with attributes, self-closing
// elements, text, comments (dropped), an optional <?xml ...?> declaration, and the five named entities plus
// numeric character references. No DOCTYPE, CDATA or namespaces. Every rejection is an InputError at the
// offending character (file:line:col) with the line quoted.

#include <string>
#include <string_view>
#include <vector>

#include "dsl/expr/source.h"
#include "common/error.h"

namespace choreo::dsl::pml {

/// One attribute as written: `name="value"` with the value's entities decoded.
struct XmlAttribute {
  std::string name;
  std::string value;
  SourceLocation where;  // the first character of the name
};

/// A run of character data between tags. `raw` is the text as written (entities already checked, not yet
/// decoded) so the whitespace rule can look at the source's own spaces; decode_entities() gives the characters.
struct XmlText {
  std::string raw;
  size_t offset = 0;  // byte offset of raw[0] in the document (for locations)
};

struct XmlNode;

/// An element: its tag, attributes, and children in document order.
struct XmlElement {
  std::string name;
  std::vector<XmlAttribute> attributes;
  std::vector<XmlNode> children;
  bool self_closing = false;
  size_t offset = 0;  // byte offset of its '<'

  /// The attribute of that name, or null.
  const XmlAttribute* attribute(std::string_view attribute_name) const;
};

/// A child of an element: text or another element.
struct XmlNode {
  bool is_text = false;
  XmlText text;
  XmlElement element;
};

/// A parsed document: the root element plus the source (to turn offsets into locations and errors).
struct XmlDocument {
  expr::SourcePtr source;
  XmlElement root;

  SourceLocation location_at(size_t offset) const { return source->location_at(offset); }
  InputError error_at(size_t offset, std::string message, std::string hint = {}) const {
    return source->error_at(offset, std::move(message), std::move(hint));
  }
};

/// Deepest element nesting accepted (deeper documents are an error, never a stack overflow).
inline constexpr int kMaxXmlDepth = 200;

/// Parses `text`, whose first character sits at `start` in its file (line 1, column 1 for a whole file; a
/// position inside a YAML file for an embedded prompt). Exactly one root element; only whitespace, comments
/// and a leading declaration around it.
XmlDocument read_xml(std::string_view text, const SourceLocation& start);

/// Replaces &lt; &gt; &amp; &quot; &apos; &#N; &#xH; by their characters (UTF-8). `raw` must have been
/// accepted by read_xml (unknown entities are left as written).
std::string decode_entities(std::string_view raw);

}  // namespace choreo::dsl::pml
