#pragma once
// Chat templates for known model families, chosen from GGUF metadata (tokenizer.chat_template),
// rendering the same text llama.cpp's built-in templates render.

#include <string>
#include <string_view>
#include <vector>

#include "runtime/model/gguf.h"

namespace choreo::model {

/// One chat turn.
struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

/// A family of chat formats.
enum class ChatFormat { None, ChatML, Llama3, Llama2 };

std::string_view chat_format_name(ChatFormat f);
/// Parses "chatml", "llama3", "llama2", "none"; throws InputError with the accepted names otherwise.
ChatFormat parse_chat_format(std::string_view name);
/// Detects the family from tokenizer.chat_template (and the vocab's special tokens); None when unknown.
ChatFormat detect_chat_format(const gguf::File& file);
/// The same heuristics on a Jinja template text alone (substring checks in llama.cpp's order); None when the
/// template belongs to a family choreo does not render.
ChatFormat detect_chat_format_from_template(std::string_view template_text);

/// Renders messages as a prompt string (special tokens written as text; tokenize with parse_special).
/// With `add_generation_prompt`, ends with the assistant header so generation continues as the assistant.
/// BOS is not included: the tokenizer adds it.
std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

/// The text that opens a turn of `role` and the text that closes it, so that callers (the message
/// cache) can render one message at a time and get exactly what render_chat gives for the whole list.
struct TurnAffixes {
  std::string prefix;
  std::string suffix;
};
TurnAffixes turn_affixes(ChatFormat f, std::string_view role, bool first_message);
/// Exact form for any message order: `previous_role` is the role of the message before ("" for the first).
/// Only Llama 2 depends on it (a turn after an assistant message reopens "[INST] "). The bool form above
/// assumes alternation (an assistant turn follows a user turn, a user or system turn follows an assistant
/// turn), so for Llama 2 it is wrong for a user turn right after a system prompt: use this form there.
TurnAffixes turn_affixes_after(ChatFormat f, std::string_view role, std::string_view previous_role);
/// The content as the format writes it between the affixes (Llama 3 trims surrounding whitespace).
/// render_chat == concatenation of prefix + format_content(content) + suffix over the messages, followed
/// by the generation prompt (the prefix of an assistant turn; empty for Llama 2, whose user turn ends
/// with "[/INST]").
std::string format_content(ChatFormat f, std::string_view content);
/// The part of `content` that format_content keeps, without copying it.
std::string_view content_in_turn(ChatFormat f, std::string_view content);

/// What a role reply leaves of its turn's `suffix` for the next turn to write: the suffix minus the special
/// text of the reply's final end-of-generation token when that is where the suffix starts (ChatML: a reply
/// that generated <|im_end|> leaves "\n"), else the whole suffix (a reply cut off by length or a stop
/// string). `eog_piece` is that token's text, or empty when the reply did not end on one.
std::string unfinished_suffix(std::string_view suffix, std::string_view eog_piece);

}  // namespace choreo::model
