#include "common/utf8.h"

#include <cassert>

namespace choreo {

void append_utf8(std::string& out, uint32_t codepoint) {
  assert(codepoint <= 0x10FFFF);
  if (codepoint < 0x80) {
    out.push_back(char(codepoint));
  } else if (codepoint < 0x800) {
    out.push_back(char(0xC0 | (codepoint >> 6)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  } else if (codepoint < 0x10000) {
    out.push_back(char(0xE0 | (codepoint >> 12)));
    out.push_back(char(0x80 | ((codepoint >> 6) & 0x3F)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (codepoint >> 18)));
    out.push_back(char(0x80 | ((codepoint >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((codepoint >> 6) & 0x3F)));
    out.push_back(char(0x80 | (codepoint & 0x3F)));
  }
}

}  // namespace choreo
