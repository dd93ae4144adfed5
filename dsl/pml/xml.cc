#include "dsl/pml/xml.h"

#include <charconv>
#include <cstdint>
#include <memory>
#include <unordered_set>

#include <fmt/format.h>

#include "common/utf8.h"

namespace choreo::dsl::pml {

const XmlAttribute* XmlElement::attribute(std::string_view attribute_name) const {
  for (const XmlAttribute& a : attributes)
    if (a.name == attribute_name) return &a;
  return nullptr;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

/// The code point of a numeric reference body ("#65" or "#x41"), or -1 when it is not a valid character.
int64_t numeric_reference(std::string_view body) {
  if (body.size() < 2 || body[0] != '#') return -1;
  bool hex = body[1] == 'x';
  std::string_view digits = body.substr(hex ? 2 : 1);
  if (digits.empty() || digits.size() > 8) return -1;
  uint32_t value = 0;  // unsigned: from_chars takes no sign; at most 8 digits fit
  const char* end = digits.data() + digits.size();
  const auto [last, ec] = std::from_chars(digits.data(), end, value, hex ? 16 : 10);
  if (ec != std::errc() || last != end) return -1;
  if (value == 0 || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return -1;
  return value;
}

/// The replacement of a named entity, or null.
const char* named_entity(std::string_view name) {
  if (name == "lt") return "<";
  if (name == "gt") return ">";
  if (name == "amp") return "&";
  if (name == "quot") return "\"";
  if (name == "apos") return "'";
  return nullptr;
}

/// The document's text with its lines indexed: the parsers ask for a location per element, attribute and text
/// run, and each must cost O(log lines), not a scan from the start (which made a 3 MB schema take minutes).
expr::SourcePtr indexed_source(std::string_view text, const SourceLocation& start) {
  auto source = std::make_shared<expr::SourceText>(expr::SourceText{std::string(text), start});
  source->index_lines();
  return source;
}

class Reader {
 public:
  Reader(std::string_view text, const SourceLocation& start)
      : doc_{indexed_source(text, start), {}}, text_(doc_.source->text) {}

  XmlDocument read() {
    // The bytes workflow YAML refuses are refused here too: a NUL, and anything that is not UTF-8.
    if (const size_t bad = find_invalid_text_byte(text_); bad != std::string_view::npos)
      throw error(bad,
                  text_[bad] == '\0' ? std::string("NUL byte in PML text")
                                     : fmt::format("invalid UTF-8 byte 0x{:02X}", uint8_t(text_[bad])),
                  text_[bad] == '\0' ? "is this a binary file?"
                                     : "PML text must be UTF-8 encoded; re-save it as UTF-8");
    if (text_.compare(0, 3, "\xEF\xBB\xBF") == 0) pos_ = 3;  // UTF-8 byte order mark
    skip_misc(true);
    if (pos_ >= text_.size())
      throw error(pos_, "the document has no element", "a schema starts with <schema name=\"...\">");
    if (text_[pos_] != '<' || pos_ + 1 >= text_.size() || !is_name_start(text_[pos_ + 1]))
      throw error(pos_, "text outside the root element", "everything must be inside one root element");
    doc_.root = element(1);
    skip_misc(false);
    if (pos_ < text_.size()) {
      if (text_[pos_] == '<')
        throw error(pos_, "a second root element", "a document holds exactly one root element");
      throw error(pos_, "text after the root element", "everything must be inside the root element");
    }
    return std::move(doc_);
  }

 private:
  InputError error(size_t offset, std::string message, std::string hint = {}) const {
    return doc_.error_at(offset, std::move(message), std::move(hint));
  }

  bool at(std::string_view s) const { return text_.compare(pos_, s.size(), s) == 0; }

  /// Whitespace, comments and (at the start only) an XML declaration outside the root element.
  void skip_misc(bool before_root) {
    bool first = before_root;
    for (;;) {
      while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
      if (at("<!--")) {
        comment();
      } else if (at("<?")) {
        if (!first || !at("<?xml")) throw error(pos_, "processing instructions are not supported",
                                                "only a leading <?xml ...?> declaration is allowed");
        size_t end = text_.find("?>", pos_);
        if (end == std::string::npos) throw error(pos_, "unterminated <?xml declaration", "end it with ?>");
        pos_ = end + 2;
      } else if (at("<!")) {
        throw error(pos_, "DOCTYPE and other <! declarations are not supported", "remove it");
      } else {
        return;
      }
      first = false;
    }
  }

  void comment() {
    size_t end = text_.find("-->", pos_ + 4);
    if (end == std::string::npos) throw error(pos_, "unterminated comment", "end it with -->");
    pos_ = end + 3;
  }

  std::string name(const char* what) {
    size_t begin = pos_;
    if (pos_ >= text_.size() || !is_name_start(text_[pos_]))
      throw error(pos_, fmt::format("expected {}", what), "names start with a letter or '_'");
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(begin, pos_ - begin));
  }

  /// Checks the entity reference at pos_ ('&') and returns its length including '&' and ';'.
  size_t entity(const char* context) {
    const size_t limit = std::min(text_.size(), pos_ + 12);
    size_t semi = std::string_view(text_).substr(0, limit).find(';', pos_);  // looks no further than the longest entity
    if (semi == std::string::npos)
      throw error(pos_, fmt::format("'&' {} must be written &amp;", context),
                  "escape '&' as &amp; and '<' as &lt; (see docs/pml.md)");
    std::string_view body(text_.data() + pos_ + 1, semi - pos_ - 1);
    if (body.empty() || (body[0] == '#' ? numeric_reference(body) < 0 : named_entity(body) == nullptr))
      throw error(pos_, fmt::format("unknown entity '&{};'", body),
                  "the entities are &lt; &gt; &amp; &quot; &apos; and &#N; / &#xH; (write '&' itself as &amp;)");
    return semi - pos_ + 1;
  }

  XmlAttribute attribute() {
    XmlAttribute a;
    size_t where = pos_;
    a.where = doc_.location_at(where);
    a.name = name("an attribute name");
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
    if (pos_ >= text_.size() || text_[pos_] != '=')
      throw error(pos_, fmt::format("attribute '{}' has no value", a.name), "write name=\"value\"");
    ++pos_;
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\''))
      throw error(pos_, fmt::format("the value of attribute '{}' must be quoted", a.name),
                  "write name=\"value\" or name='value'");
    const char quote = text_[pos_++];
    size_t begin = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '<')
        throw error(pos_, fmt::format("'<' in the value of attribute '{}' must be written &lt;", a.name));
      pos_ += text_[pos_] == '&' ? entity("in an attribute value") : 1;
    }
    if (pos_ >= text_.size())
      throw error(begin - 1, fmt::format("the value of attribute '{}' is never closed", a.name),
                  fmt::format("end it with {}", quote));
    a.value = decode_entities(text_.substr(begin, pos_ - begin));
    ++pos_;
    return a;
  }

  /// An element starting at pos_ ('<' followed by a name).
  XmlElement element(int depth) {
    XmlElement e;
    e.offset = pos_;
    if (depth > kMaxXmlDepth)
      throw error(pos_, fmt::format("elements nested deeper than {} levels", kMaxXmlDepth), "flatten the document");
    ++pos_;
    e.name = name("a tag name");
    std::unordered_set<std::string_view> attribute_names;  // views into the document: a tag may hold many
    for (;;) {
      size_t before = pos_;
      while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
      if (pos_ >= text_.size()) throw error(e.offset, fmt::format("the tag <{}> is never closed with '>'", e.name));
      if (at("/>")) {
        pos_ += 2;
        e.self_closing = true;
        return e;
      }
      if (text_[pos_] == '>') {
        ++pos_;
        break;
      }
      if (pos_ == before)
        throw error(pos_, fmt::format("unexpected '{}' in the tag <{}>", text_[pos_], e.name),
                    "attributes are separated by spaces and written name=\"value\"");
      size_t attribute_offset = pos_;
      XmlAttribute a = attribute();
      if (!attribute_names.insert(std::string_view(text_).substr(attribute_offset, a.name.size())).second)
        throw error(attribute_offset, fmt::format("attribute '{}' is given twice in <{}>", a.name, e.name));
      e.attributes.push_back(std::move(a));
    }
    content(e, depth);
    return e;
  }

  /// Children of `e` up to and including its closing tag.
  void content(XmlElement& e, int depth) {
    last_was_comment_ = false;
    for (;;) {
      if (pos_ >= text_.size())
        throw error(e.offset, fmt::format("<{}> is never closed", e.name), fmt::format("add </{}>", e.name));
      if (text_[pos_] != '<') {
        text_run(e);
        last_was_comment_ = false;
        continue;
      }
      if (at("</")) {
        size_t close = pos_;
        pos_ += 2;
        std::string closing = name("a tag name after '</'");
        while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
        if (pos_ >= text_.size() || text_[pos_] != '>')
          throw error(close, fmt::format("the closing tag </{}> has no '>'", closing));
        ++pos_;
        if (closing != e.name) {
          SourceLocation open = doc_.location_at(e.offset);
          throw error(close, fmt::format("closing tag </{}> does not match <{}> opened at {}:{}", closing, e.name,
                                         open.line, open.col),
                      fmt::format("close <{}> with </{}> first", e.name, e.name));
        }
        return;
      }
      last_was_comment_ = false;
      if (at("<!--")) {
        comment();
        last_was_comment_ = true;
      } else if (at("<![CDATA[")) {
        throw error(pos_, "CDATA sections are not supported",
                    "escape '<' as &lt; and '&' as &amp;, or load the text from a file with src=\"...\"");
      } else if (at("<!") || at("<?")) {
        throw error(pos_, "declarations and processing instructions are not allowed inside elements");
      } else if (pos_ + 1 < text_.size() && is_name_start(text_[pos_ + 1])) {
        XmlNode child;
        child.element = element(depth + 1);
        e.children.push_back(std::move(child));
      } else {
        throw error(pos_, "'<' in text must be written &lt;", "escape '<' as &lt; and '&' as &amp; (see docs/pml.md)");
      }
    }
  }

  void text_run(XmlElement& e) {
    size_t begin = pos_;
    while (pos_ < text_.size() && text_[pos_] != '<') pos_ += text_[pos_] == '&' ? entity("in text") : 1;
    // Comments split text in the source but not in meaning: text on both sides of one is one run.
    if (last_was_comment_ && !e.children.empty() && e.children.back().is_text) {
      e.children.back().text.raw += text_.substr(begin, pos_ - begin);
      return;
    }
    XmlNode child;
    child.is_text = true;
    child.text.raw = std::string(text_.substr(begin, pos_ - begin));
    child.text.offset = begin;
    e.children.push_back(std::move(child));
  }

  XmlDocument doc_;
  const std::string& text_;
  size_t pos_ = 0;
  bool last_was_comment_ = false;
};

}  // namespace

XmlDocument read_xml(std::string_view text, const SourceLocation& start) { return Reader(text, start).read(); }

std::string decode_entities(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    size_t semi = raw.find(';', i);
    if (semi == std::string::npos) {
      out += raw[i];
      continue;
    }
    std::string_view body = raw.substr(i + 1, semi - i - 1);
    if (const char* named = body.empty() || body[0] == '#' ? nullptr : named_entity(body)) {
      out += named;
    } else if (int64_t cp = numeric_reference(body); cp > 0) {
      append_utf8(out, uint32_t(cp));
    } else {
      out += raw[i];
      continue;
    }
    i = semi;
  }
  return out;
}

}  // namespace choreo::dsl::pml
