// Values as built (dsl/expr/value.h): the summary each list and dict records equals a walk over it; the
// nesting and size limits hold for every way of building a value; assign_all equals assign_at applied one at
// a time and never changes a value someone else holds; every walk over the largest allowed value fits a small
// stack; find_too_deep_json finds the first bracket past the limit.

#include <doctest/doctest.h>
#include <pthread.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsl/expr/value.h"

using namespace choreo::dsl::expr;

namespace {

/// The summary worked out by walking the value (the property the recorded one must equal).
struct Walked {
  int depth = 0;
  uint64_t elements = 0;
  uint64_t message_depths = 0, unknown_text_depths = 0;
};

void walk(const Value& v, int at, Walked& out) {
  const uint64_t bit = uint64_t(1) << std::min(at, 63);
  if (v.type() == Type::Message) {
    out.message_depths |= bit;
    if (!v.as_message().text_known) out.unknown_text_depths |= bit;
  }
  std::vector<const Value*> children;
  if (v.type() == Type::List)
    for (const Value& item : v.as_list()) children.push_back(&item);
  if (v.type() == Type::Dict)
    for (const auto& [key, item] : v.as_dict()) children.push_back(&item);
  if (!children.empty() || v.type() == Type::List || v.type() == Type::Dict) out.depth = std::max(out.depth, 1);
  for (const Value* child : children) {
    Walked inner;
    walk(*child, at + 1, inner);
    out.depth = std::max(out.depth, inner.depth + 1);
    out.elements += 1 + inner.elements;
    out.message_depths |= inner.message_depths;
    out.unknown_text_depths |= inner.unknown_text_depths;
  }
}

Walked walked(const Value& v) {
  Walked out;
  walk(v, 0, out);
  return out;
}

/// A random value of at most `depth` levels, sharing earlier values now and then.
Value random_value(std::mt19937& rng, int depth, std::vector<Value>& made) {
  const int kind = int(rng() % (depth > 0 ? 7 : 4));
  Value v;
  switch (kind) {
    case 0: v = Value::integer(int64_t(rng() % 100)); break;
    case 1: v = Value::string(std::string(rng() % 4, 'x')); break;
    case 2: v = Value::message({rng() % 10, "t", rng() % 2 == 0}); break;
    case 3: v = made.empty() ? Value::null() : made[rng() % made.size()]; break;
    case 4:
    case 5: {
      List items;
      for (size_t n = rng() % 4; n > 0; --n) items.push_back(random_value(rng, depth - 1, made));
      v = Value::list(std::move(items));
      break;
    }
    default: {
      Dict items;
      for (size_t n = rng() % 3; n > 0; --n) items["k" + std::to_string(rng() % 5)] = random_value(rng, depth - 1, made);
      v = Value::dict(std::move(items));
    }
  }
  if (v.type() == Type::List || v.type() == Type::Dict) made.push_back(v);
  return v;
}

/// A list nested `depth` levels deep around a message.
Value nested(int depth) {
  Value v = Value::message({1, "m"});
  for (int i = 0; i < depth; ++i) v = Value::list({v});
  return v;
}

/// Runs `body` on a thread with a stack of `bytes` (to show a walk's recursion stays within it).
void on_small_stack(size_t bytes, const std::function<void()>& body) {
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  REQUIRE(pthread_attr_setstacksize(&attributes, bytes) == 0);
  pthread_t thread;
  auto trampoline = [](void* p) -> void* {
    (*static_cast<const std::function<void()>*>(p))();
    return nullptr;
  };
  REQUIRE(pthread_create(&thread, &attributes, trampoline, const_cast<std::function<void()>*>(&body)) == 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attributes);
}

}  // namespace

TEST_CASE("value summaries: depth, elements and message depths equal a walk over the value") {
  std::mt19937 rng(7);
  std::vector<Value> made;
  int composite = 0;
  for (int i = 0; i < 2000; ++i) {
    const Value v = random_value(rng, 6, made);
    const Value::Summary s = v.summary();
    const Walked w = walked(v);
    CHECK(s.depth == w.depth);
    CHECK(s.elements == w.elements);
    CHECK(s.message_depths == w.message_depths);
    CHECK(s.unknown_text_depths == w.unknown_text_depths);
    composite += s.depth > 1 && s.message_depths > 1;
  }
  CHECK(composite > 100);  // not vacuous: many nested values hold messages below the top
}

TEST_CASE("values nest at most kMaxValueDepth levels, as lists or as dicts") {
  CHECK(nested(kMaxValueDepth).depth() == kMaxValueDepth);
  CHECK_THROWS_AS(Value::list({nested(kMaxValueDepth)}), ValueLimitError);
  CHECK_THROWS_AS(Value::dict({{"k", nested(kMaxValueDepth)}}), ValueLimitError);
  try {
    Value::list({nested(kMaxValueDepth)});
  } catch (const ValueLimitError& e) {
    CHECK(e.message().find(std::to_string(kMaxValueDepth) + " levels") != std::string::npos);
    CHECK(!e.hint().empty());
  }
  // Messages deeper than 63 levels are recorded in the last bit.
  CHECK(nested(kMaxValueDepth).summary().message_depths == uint64_t(1) << 63);
}

TEST_CASE("a value holds at most kMaxValueElements elements, a shared sublist counted each time it appears") {
  const Value thousand = Value::list(List(999, Value::integer(1)));  // 999 elements
  // 1000 copies of it: 1000 + 1000 * 999 = 10^6 elements, exactly the limit.
  CHECK(Value::list(List(1000, thousand)).summary().elements == kMaxValueElements);
  CHECK_THROWS_AS(Value::list(List(1001, thousand)), ValueLimitError);
  // Doubling a shared list: cheap in memory, but its written-out size doubles each time until the limit.
  Value x = Value::list({Value::message({1, "m"})});
  int doublings = 0;
  try {
    for (; doublings < 64; ++doublings) x = Value::list({x, x});
  } catch (const ValueLimitError& e) {
    CHECK(e.message().find("elements") != std::string::npos);
  }
  CHECK(doublings == 18);  // after k doublings it holds 3 * 2^k - 2 elements: k = 18 fits, k = 19 does not
}

TEST_CASE("assign_all equals assign_at applied in order, and leaves other holders of the value unchanged") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<Assignment> assignments;
    for (size_t n = rng() % 6; n > 0; --n) {
      Assignment a;
      for (size_t d = rng() % 4; d > 0; --d) a.indices.push_back(int64_t(rng() % 4));
      a.value = Value::integer(int64_t(rng() % 1000));
      assignments.push_back(std::move(a));
    }
    const Value start = trial % 3 == 0 ? Value() : Value::list({Value::integer(-1), Value::list({Value::integer(-2)})});
    const std::string before = to_json(start);
    Value one_by_one = start;
    for (const Assignment& a : assignments) one_by_one = assign_at(one_by_one, a.indices, a.value);
    const Value all = assign_all(start, assignments);
    CHECK(equal(all, one_by_one));
    CHECK(to_json(start) == before);  // `start` is still held here, so it must not have been changed
  }
  // The only holder gives its list up: the result is right whether it was copied or taken over.
  Value alone = Value::list(List(5, Value::integer(0)));
  const Value changed = assign_all(std::move(alone), std::vector<Assignment>{{{2}, Value::integer(7)}});
  CHECK(to_json(changed) == "[0, 0, 7, 0, 0]");
  // Too deep a path is an error, not a value.
  CHECK_THROWS_AS(assign_at(Value(), std::vector<int64_t>(kMaxValueDepth + 1, 0), Value::integer(1)), ValueLimitError);
}

TEST_CASE("every walk over the deepest and the largest allowed values fits in 256 KiB of stack") {
  // Recursion is bounded by kMaxValueDepth; the element limit bounds the work of walking a shared structure.
  bool finished = false;
  on_small_stack(256 << 10, [&] {
    const Value deep = nested(kMaxValueDepth);
    Value wide = Value::list({Value::message({1, "m"})});
    for (int i = 0; i < 18; ++i) wide = Value::list({wide, wide});
    for (const Value* v : std::initializer_list<const Value*>{&deep, &wide}) {
      const Value copy = *v;
      CHECK(equal(*v, copy));
      CHECK(!to_json(*v).empty());
      CHECK(render_limited(*v, 1 << 20).has_value() == (v == &deep));  // `wide` is ~4 MB written out
      CHECK(describe(*v).size() <= 40);
    }
    finished = true;
  });  // the values are destroyed on the small stack too
  CHECK(finished);
}

TEST_CASE("find_too_deep_json: the offset of the first bracket past the limit, strings and escapes skipped") {
  for (int depth : {1, 5, kMaxValueDepth - 1, kMaxValueDepth, 1000}) {
    // Brackets and an escaped quote inside a string do not count; the object itself is level 1.
    const std::string text = "{\"a\": \"[[{\\\"\", \"b\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
    CHECK(nlohmann::json::accept(text));
    const size_t found = find_too_deep_json(text);
    if (1 + depth <= kMaxValueDepth) {
      CHECK(found == std::string::npos);
    } else {
      const size_t first = text.find('[', text.find("\"b\""));
      CHECK(found == first + size_t(kMaxValueDepth - 1));  // the bracket opening level kMaxValueDepth + 1
    }
  }
  CHECK(find_too_deep_json(std::string(100000, '{')) == size_t(kMaxValueDepth));  // need not be valid JSON
}
