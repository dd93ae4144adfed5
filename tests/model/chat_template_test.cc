// Chat templates: renderings equal llama.cpp's built-in templates (through llama-cpp-python) and SmolLM2's
// own Jinja template (through jinja2); rendering message by message with the turn affixes equals rendering
// the whole conversation; the family is detected from GGUF metadata the way llama.cpp detects it.

#include "runtime/model/chat_template.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "runtime/model/gguf.h"
#include "tests/reference/reference.h"
#include "tests/test_paths.h"

using choreo::InputError;
using choreo::model::ChatFormat;
using choreo::model::ChatMessage;
using choreo::model::TurnAffixes;
namespace fs = std::filesystem;
namespace model = choreo::model;
using json = nlohmann::json;

namespace {

/// One conversation to render.
struct Conversation {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
};

std::vector<Conversation> conversations() {
  const std::vector<std::vector<ChatMessage>> lists = {
      {{"user", "Hello"}},
      {{"system", "You are terse."}, {"user", "What is 2+2?"}},
      {{"system", "You are terse."}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}},
      {{"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}, {"assistant", "6"}},
      {{"user", "  padded  \n"}, {"assistant", "\tanswer\n\n"}, {"user", "\n"}},
      {{"user", "a"}, {"user", "b"}},
      {{"assistant", "I start"}, {"user", "ok"}},
      {{"system", "s1"}, {"system", "s2"}, {"user", "u"}},
      {{"user", "multi\nline\n\ncontent with <tags> & unicode é 🦙"}, {"tool", "{\"x\": 1}"}},
      {},
  };
  std::vector<Conversation> out;
  for (const auto& messages : lists) {
    for (const bool gen : {false, true}) out.push_back({messages, gen});
  }
  return out;
}

/// Runs tests/reference/chat_template_ref.py on the conversations (and `model`'s own template if given).
json reference_renderings(const std::vector<Conversation>& convs, const std::string& model = "") {
  json input = json::array();
  for (const auto& c : convs) {
    json messages = json::array();
    for (const auto& m : c.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    input.push_back({{"messages", messages}, {"add_generation_prompt", c.add_generation_prompt}});
  }
  choreo::testing::ScratchDir dir;
  const fs::path path = dir.path / "cases.json";
  std::ofstream(path) << input.dump();
  std::vector<std::string> arguments{path.string()};
  if (!model.empty()) arguments.push_back(model);
  return json::parse(choreo::testing::run_reference_script("chat_template_ref.py", arguments, dir.path));
}

std::string describe(const Conversation& c) {
  json messages = json::array();
  for (const auto& m : c.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
  return fmt::format("{} add_generation_prompt={}", messages.dump(), c.add_generation_prompt);
}

/// Renders message by message from the affixes, the way the message cache does.
std::string render_by_affixes(ChatFormat f, const Conversation& c, bool use_previous_role) {
  std::string out;
  std::string previous_role;
  for (size_t i = 0; i < c.messages.size(); ++i) {
    const ChatMessage& m = c.messages[i];
    const TurnAffixes affixes = use_previous_role ? model::turn_affixes_after(f, m.role, previous_role)
                                                  : model::turn_affixes(f, m.role, i == 0);
    out += affixes.prefix + model::format_content(f, m.content) + affixes.suffix;
    previous_role = m.role;
  }
  if (c.add_generation_prompt && f != ChatFormat::Llama2) {
    out += model::turn_affixes_after(f, "assistant", previous_role).prefix;
  }
  return out;
}

}  // namespace

TEST_CASE("chat: format names parse and print, unknown names are an InputError listing the choices") {
  for (const ChatFormat f : {ChatFormat::None, ChatFormat::ChatML, ChatFormat::Llama3, ChatFormat::Llama2}) {
    CHECK(model::parse_chat_format(model::chat_format_name(f)) == f);
  }
  CHECK(model::chat_format_name(ChatFormat::ChatML) == "chatml");
  try {
    model::parse_chat_format("vicuna");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("vicuna") != std::string::npos);
    CHECK(e.hint().find("chatml, llama3, llama2, none") != std::string::npos);
  }
}

TEST_CASE("chat: render_chat equals llama.cpp's built-in chatml, llama3 and llama2-sys templates") {
  const std::vector<Conversation> convs = conversations();
  const json reference = reference_renderings(convs);
  REQUIRE(reference.size() == convs.size());
  int n_compared = 0;
  for (size_t i = 0; i < convs.size(); ++i) {
    const auto& c = convs[i];
    for (const auto& [f, name] :
         {std::pair{ChatFormat::ChatML, "chatml"}, std::pair{ChatFormat::Llama3, "llama3"},
          std::pair{ChatFormat::Llama2, "llama2-sys"}}) {
      const std::string ours = model::render_chat(f, c.messages, c.add_generation_prompt);
      const std::string theirs = reference[i][name];
      CHECK_MESSAGE(ours == theirs, name, " ", describe(c), "\n ours:      ", json(ours).dump(),
                    "\n llama.cpp: ", json(theirs).dump());
      ++n_compared;
    }
  }
  MESSAGE(n_compared, " renderings compared with llama.cpp");
}

TEST_CASE("chat: SmolLM2's own Jinja template equals chatml, except for its default system prompt") {
  // SmolLM2's tokenizer.chat_template inserts "You are a helpful AI assistant named SmolLM, trained by
  // Hugging Face" when the conversation does not start with a system message. llama.cpp's built-in chatml
  // (which llama.cpp uses for this model) does not, and neither does choreo: a caller who wants it passes it.
  const std::string path = choreo::testing::require_file(choreo::testing::default_model());
  const std::vector<Conversation> convs = conversations();
  const json reference = reference_renderings(convs, path);
  const std::string default_system =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
  for (size_t i = 0; i < convs.size(); ++i) {
    const auto& c = convs[i];
    const std::string ours = model::render_chat(ChatFormat::ChatML, c.messages, c.add_generation_prompt);
    const bool starts_with_system = !c.messages.empty() && c.messages.front().role == "system";
    const std::string expected_jinja =
        (starts_with_system || c.messages.empty() ? "" : default_system) + ours;
    CHECK_MESSAGE(reference[i]["jinja"].get<std::string>() == expected_jinja, describe(c));
  }
  CHECK(model::detect_chat_format(choreo::gguf::File::open(path)) == ChatFormat::ChatML);
}

TEST_CASE("chat: rendering message by message with the turn affixes equals render_chat") {
  int n_exact_bool_form = 0;
  for (const ChatFormat f : {ChatFormat::None, ChatFormat::ChatML, ChatFormat::Llama3, ChatFormat::Llama2}) {
    for (const Conversation& c : conversations()) {
      const std::string whole = model::render_chat(f, c.messages, c.add_generation_prompt);
      if (c.messages.empty()) continue;  // llama.cpp's Llama 2 opens "[INST] " even for no messages
      CHECK_MESSAGE(render_by_affixes(f, c, true) == whole, model::chat_format_name(f), " ", describe(c));
      // The bool form knows only "first or not" and assumes user/system and assistant turns alternate; for
      // Llama 2 (the one format where it matters) it is exact exactly when they do.
      bool alternates = true;
      const auto user_side = [](const std::string& role) { return role == "user" || role == "system"; };
      for (size_t i = 1; i < c.messages.size(); ++i) {
        alternates &= user_side(c.messages[i].role) != user_side(c.messages[i - 1].role);
      }
      if (f != ChatFormat::Llama2 || alternates) {
        CHECK_MESSAGE(render_by_affixes(f, c, false) == whole, model::chat_format_name(f), " ", describe(c));
        ++n_exact_bool_form;
      }
    }
  }
  CHECK(n_exact_bool_form > 40);
  // The usual Llama 2 conversation, rendered message by message with the bool form.
  const std::vector<ChatMessage> chat = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  std::string by_parts;
  for (size_t i = 0; i < chat.size(); ++i) {
    const TurnAffixes a = model::turn_affixes(ChatFormat::Llama2, chat[i].role, i == 0);
    by_parts += a.prefix + chat[i].content + a.suffix;
  }
  CHECK(by_parts == "[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  CHECK(by_parts == model::render_chat(ChatFormat::Llama2, chat, true));
  // The shapes themselves, written out from the model cards.
  CHECK(model::turn_affixes(ChatFormat::ChatML, "user", true).prefix == "<|im_start|>user\n");
  CHECK(model::turn_affixes(ChatFormat::ChatML, "user", true).suffix == "<|im_end|>\n");
  CHECK(model::turn_affixes(ChatFormat::Llama3, "assistant", false).prefix ==
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(model::turn_affixes(ChatFormat::Llama3, "assistant", false).suffix == "<|eot_id|>");
  CHECK(model::turn_affixes(ChatFormat::Llama2, "system", true).prefix == "[INST] <<SYS>>\n");
  CHECK(model::turn_affixes_after(ChatFormat::Llama2, "user", "system").prefix.empty());
  CHECK(model::turn_affixes_after(ChatFormat::Llama2, "user", "assistant").prefix == "[INST] ");
  CHECK(model::turn_affixes(ChatFormat::None, "user", true).prefix.empty());
  CHECK(model::format_content(ChatFormat::Llama3, " \t x y \n") == "x y");
  CHECK(model::format_content(ChatFormat::ChatML, " \t x y \n") == " \t x y \n");
}

TEST_CASE("chat: the family is detected from tokenizer.chat_template as llama.cpp detects it") {
  using model::detect_chat_format_from_template;
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if "
      "loop.index0 == "
      "0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
      "add_generation_prompt "
      "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
  const std::string llama2 =
      "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content "
      "= "
      "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{% if "
      "message['role'] "
      "== 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% endif %}{% endfor %}";
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' "
      "+ '\\n'}}{% endfor %}";
  CHECK(detect_chat_format_from_template(llama3) == ChatFormat::Llama3);
  CHECK(detect_chat_format_from_template(llama2) == ChatFormat::Llama2);
  CHECK(detect_chat_format_from_template(chatml) == ChatFormat::ChatML);
  CHECK(detect_chat_format_from_template("chatml") == ChatFormat::ChatML);
  CHECK(detect_chat_format_from_template("llama3") == ChatFormat::Llama3);
  // Families choreo does not render are not mistaken for one it does.
  CHECK(detect_chat_format_from_template("<|im_start|>{{ role }}<|im_sep|>{{ content }}<|im_end|>") ==
        ChatFormat::None);  // Phi-4
  CHECK(detect_chat_format_from_template("[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]") == ChatFormat::None);
  CHECK(detect_chat_format_from_template("<|user|>\n{{ c }}<|end|>\n<|assistant|>\n") == ChatFormat::None);
  CHECK(detect_chat_format_from_template("<start_of_turn>user\n{{ c }}<end_of_turn>") == ChatFormat::None);
  CHECK(detect_chat_format_from_template("USER: {{ c }} ASSISTANT: ") == ChatFormat::None);
  CHECK(detect_chat_format_from_template("") == ChatFormat::None);
}

TEST_CASE("chat: without a template the vocabulary's turn markers decide") {
  const auto detect = [](std::vector<std::string> tokens, std::string tmpl) {
    choreo::gguf::Writer writer;
    writer.set_string("tokenizer.ggml.model", "gpt2");
    writer.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
    if (!tmpl.empty()) writer.set_string("tokenizer.chat_template", tmpl);
    const std::vector<uint8_t> bytes = writer.to_bytes();
    return model::detect_chat_format(choreo::gguf::File::parse(bytes, "t.gguf"));
  };
  CHECK(detect({"a", "<|im_start|>", "<|im_end|>"}, "") == ChatFormat::ChatML);
  CHECK(detect({"a", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, "") == ChatFormat::Llama3);
  CHECK(detect({"a", "b"}, "") == ChatFormat::None);
  // A template wins over the tokens.
  CHECK(detect({"<|im_start|>", "<|im_end|>"}, "<start_of_turn>") == ChatFormat::None);
  const std::string stories = choreo::testing::shared_file("models/stories260K.gguf");
  CHECK(model::detect_chat_format(choreo::gguf::File::open(stories)) == ChatFormat::None);
}

TEST_CASE("chat: a role reply leaves the part of its turn suffix it did not generate") {
  const std::string suffix = choreo::model::turn_affixes(choreo::model::ChatFormat::ChatML, "assistant", false).suffix;
  REQUIRE(suffix == "<|im_end|>\n");
  CHECK(choreo::model::unfinished_suffix(suffix, "<|im_end|>") == "\n");  // the reply closed its own turn
  CHECK(choreo::model::unfinished_suffix(suffix, "") == suffix);          // cut off by length or a stop string
  CHECK(choreo::model::unfinished_suffix(suffix, "<|endoftext|>") == suffix);  // another EOG token
}
