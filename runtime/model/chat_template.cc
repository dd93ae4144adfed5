#include "runtime/model/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <initializer_list>

#include "common/error.h"

namespace choreo::model {

namespace {

struct FormatName {
  ChatFormat format;
  std::string_view name;
};
constexpr std::array<FormatName, 4> kNames = {{
    {ChatFormat::None, "none"},
    {ChatFormat::ChatML, "chatml"},
    {ChatFormat::Llama3, "llama3"},
    {ChatFormat::Llama2, "llama2"},
}};

bool is_c_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// llama.cpp trims with isspace() in the C locale.
std::string_view trim(std::string_view text) {
  while (!text.empty() && is_c_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_c_space(text.back())) text.remove_suffix(1);
  return text;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}
bool contains_all(std::string_view text, std::initializer_list<std::string_view> parts) {
  return std::all_of(parts.begin(), parts.end(), [&](std::string_view part) { return contains(text, part); });
}

}  // namespace

std::string_view chat_format_name(ChatFormat f) {
  for (const auto& entry : kNames) {
    if (entry.format == f) return entry.name;
  }
  return "none";
}

ChatFormat parse_chat_format(std::string_view name) {
  for (const auto& entry : kNames) {
    if (entry.name == name) return entry.format;
  }
  throw InputError(fmt::format("unknown chat format '{}'", name), "use one of: chatml, llama3, llama2, none");
}

// The checks of llama.cpp's llm_chat_detect_template, in its order, up to the last family choreo renders;
// a template that an earlier check assigns to another family is not ours to render.
ChatFormat detect_chat_format_from_template(std::string_view tmpl) {
  if (const auto named =
          std::find_if(kNames.begin(), kNames.end(), [&](const FormatName& n) { return n.name == tmpl; });
      named != kNames.end()) {
    return named->format;
  }
  if (contains(tmpl, "<|im_start|>")) {
    // Phi-4 and SmolVLM use the ChatML markers with a different layout.
    return contains(tmpl, "<|im_sep|>") || contains(tmpl, "<end_of_utterance>") ? ChatFormat::None
                                                                                : ChatFormat::ChatML;
  }
  if (tmpl.substr(0, 7) == "mistral" || contains(tmpl, "[INST]")) {
    const bool mistral = contains(tmpl, "[SYSTEM_PROMPT]") || contains(tmpl, "' [INST] ' + system_message") ||
                         contains(tmpl, "[AVAILABLE_TOOLS]");
    // llama.cpp knows four Llama 2 variants (with or without <<SYS>>, trimmed content, BOS inside the
    // history); choreo renders them all as the <<SYS>> one, which differs from the others only in the
    // system block, whitespace around content and BOS between turns.
    return mistral ? ChatFormat::None : ChatFormat::Llama2;
  }
  const bool other_family =
      contains_all(tmpl, {"<|assistant|>", "<|end|>"}) || contains(tmpl, "[gMASK]<sop>") ||
      contains_all(tmpl, {"<|assistant|>", "<|user|>"}) ||
      contains_all(tmpl, {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}) ||
      contains_all(tmpl, {"<|user|>", "<|endoftext|>"}) || contains(tmpl, "bos_token + message['role']") ||
      contains(tmpl, "<start_of_turn>") || contains(tmpl, "'\\n\\nAssistant: ' + eos_token") ||
      contains(tmpl, "GPT4 Correct ") || contains_all(tmpl, {"USER: ", "ASSISTANT: "}) ||
      contains_all(tmpl, {"### Instruction:", "<|EOT|>"}) ||
      contains_all(tmpl, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"});
  if (other_family) return ChatFormat::None;
  if (contains_all(tmpl, {"<|start_header_id|>", "<|end_header_id|>"})) return ChatFormat::Llama3;
  return ChatFormat::None;
}

ChatFormat detect_chat_format(const gguf::File& file) {
  const std::string tmpl = file.get_string("tokenizer.chat_template", "");
  if (!tmpl.empty()) return detect_chat_format_from_template(tmpl);
  // No template: the turn markers in the vocabulary still tell the two token-delimited families apart.
  const std::vector<std::string>& tokens = file.get_string_array("tokenizer.ggml.tokens");
  const auto has_token = [&](std::string_view text) {
    return std::find(tokens.begin(), tokens.end(), text) != tokens.end();
  };
  if (has_token("<|im_start|>") && has_token("<|im_end|>")) return ChatFormat::ChatML;
  if (has_token("<|start_header_id|>") && has_token("<|end_header_id|>") && has_token("<|eot_id|>")) {
    return ChatFormat::Llama3;
  }
  return ChatFormat::None;
}

std::string_view content_in_turn(ChatFormat f, std::string_view content) {
  return f == ChatFormat::Llama3 ? trim(content) : content;
}

std::string format_content(ChatFormat f, std::string_view content) {
  return std::string(content_in_turn(f, content));
}

TurnAffixes turn_affixes_after(ChatFormat f, std::string_view role, std::string_view previous_role) {
  switch (f) {
    case ChatFormat::None:
      return {};
    case ChatFormat::ChatML:
      return {fmt::format("<|im_start|>{}\n", role), "<|im_end|>\n"};
    case ChatFormat::Llama3:
      return {fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n", role), "<|eot_id|>"};
    case ChatFormat::Llama2: {
      // One [INST] block holds the system prompt, the user message and " [/INST]"; the assistant reply
      // follows and ends with </s>. Roles other than system and user count as the assistant (as in
      // llama.cpp).
      const bool opens_block =
          previous_role.empty() || (previous_role != "system" && previous_role != "user");
      const std::string open = opens_block ? "[INST] " : "";
      if (role == "system") return {open + "<<SYS>>\n", "\n<</SYS>>\n\n"};
      if (role == "user") return {open, " [/INST]"};
      return {open, "</s>"};
    }
  }
  return {};
}

TurnAffixes turn_affixes(ChatFormat f, std::string_view role, bool first_message) {
  // Without the previous role, assume the usual alternation: replies follow user turns, and user or system
  // turns follow replies.
  const bool user_side = role == "user" || role == "system";
  return turn_affixes_after(f, role, first_message ? "" : user_side ? "assistant" : "user");
}

std::string render_chat(ChatFormat f, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  // llama.cpp opens the first [INST] block even for an empty conversation.
  if (messages.empty() && f == ChatFormat::Llama2) return "[INST] ";
  std::string out;
  std::string_view previous_role;
  for (const ChatMessage& message : messages) {
    const TurnAffixes affixes = turn_affixes_after(f, message.role, previous_role);
    out += affixes.prefix;
    out += format_content(f, message.content);
    out += affixes.suffix;
    previous_role = message.role;
  }
  if (add_generation_prompt && (f == ChatFormat::ChatML || f == ChatFormat::Llama3)) {
    out += turn_affixes_after(f, "assistant", previous_role).prefix;
  }
  return out;
}

std::string unfinished_suffix(std::string_view suffix, std::string_view eog_piece) {
  if (!eog_piece.empty() && suffix.substr(0, eog_piece.size()) == eog_piece)
    return std::string(suffix.substr(eog_piece.size()));
  return std::string(suffix);
}

}  // namespace choreo::model
