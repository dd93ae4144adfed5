// GGUF reader/writer: round trips for every value type, the real shared models, and corrupt inputs (each must
// become an InputError that starts with the file name and says what is wrong).

#include "runtime/model/gguf.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels/backend.h"
#include "common/error.h"
#include "runtime/model/llama.h"
#include "tests/test_paths.h"

using choreo::InputError;
using choreo::gguf::File;
using choreo::gguf::Value;
using choreo::gguf::ValueType;
using choreo::gguf::Writer;
using choreo::kernels::DType;

namespace {

/// An independent little-endian GGUF encoder: lets the tests build files the Writer would refuse to make.
struct Raw {
  std::vector<uint8_t> bytes;
  /// Appends v's bits least significant byte first (explicit shifts: independent of host byte order).
  template <typename T>
  Raw& put(T v) {
    using Bits = std::conditional_t<
        sizeof(T) == 1, uint8_t,
        std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
    static_assert(sizeof(Bits) == sizeof(T));
    const auto bits = std::bit_cast<Bits>(v);
    for (size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<uint8_t>(bits >> (8 * i)));
    return *this;
  }
  Raw& str(std::string_view s) {
    put<uint64_t>(s.size());
    for (char c : s) bytes.push_back(static_cast<uint8_t>(c));
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    for (char c : std::string_view("GGUF")) bytes.push_back(static_cast<uint8_t>(c));
    return put(version).put(n_tensors).put(n_kv);
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
  Raw& tensor(std::string_view name, std::vector<int64_t> shape, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(shape.size()));
    for (int64_t d : shape) put(d);
    return put(type).put(offset);
  }
  Raw& pad(size_t alignment = 32) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) { return fill(n, 0); }
  Raw& fill(size_t n, uint8_t byte) {
    for (size_t i = 0; i < n; ++i) bytes.push_back(byte);
    return *this;
  }
};

/// Parses `bytes` as "bad.gguf" and returns the error message (empty if it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes, std::string name = "bad.gguf") {
  try {
    File::parse(bytes, name);
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).rfind(name + ": ", 0) == 0);
    return e.what();
  }
  return {};
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Value scalar(ValueType t, std::variant<int64_t, uint64_t, double, bool, std::string> v) {
  Value value;
  value.type = t;
  value.scalar = std::move(v);
  return value;
}

Value array(ValueType elem) {
  Value value;
  value.type = ValueType::ARRAY;
  value.elem_type = elem;
  return value;
}

/// A writer holding one value of every scalar type (at its extremes), an array of every element type, and
/// tensors of three types.
Writer every_type_writer(size_t alignment, std::shared_ptr<int> fills) {
  Writer w(alignment);
  w.set("u8", scalar(ValueType::UINT8, uint64_t{255}));
  w.set("i8", scalar(ValueType::INT8, int64_t{-128}));
  w.set("u16", scalar(ValueType::UINT16, uint64_t{65535}));
  w.set("i16", scalar(ValueType::INT16, int64_t{-32768}));
  w.set_u32("u32", 4294967295u);
  w.set_i32("i32", std::numeric_limits<int32_t>::min());
  w.set_f32("f32", 0.1f);
  w.set_bool("bool", true);
  w.set_string("string", std::string("h\xc3\xa9llo\0world", 12));
  w.set("u64", scalar(ValueType::UINT64, std::numeric_limits<uint64_t>::max()));
  w.set("i64", scalar(ValueType::INT64, std::numeric_limits<int64_t>::min()));
  w.set("f64", scalar(ValueType::FLOAT64, 1e300));
  struct IntArray {
    const char* key;
    ValueType type;
    std::vector<int64_t> values;
  };
  for (const IntArray& a :
       std::vector<IntArray>{{"a.u8", ValueType::UINT8, {0, 1, 255}},
                             {"a.i8", ValueType::INT8, {-128, 0, 127}},
                             {"a.u16", ValueType::UINT16, {65535, 7}},
                             {"a.i16", ValueType::INT16, {-32768, 32767}},
                             {"a.u32", ValueType::UINT32, {4294967295, 0}},
                             {"a.i32", ValueType::INT32, {-2147483648LL, 5}},
                             {"a.u64", ValueType::UINT64, {-1, 42}},  // -1 = 2^64-1 bits
                             {"a.i64", ValueType::INT64, {std::numeric_limits<int64_t>::min()}},
                             {"a.bool", ValueType::BOOL, {1, 0, 1}}}) {
    Value v = array(a.type);
    v.ints = a.values;
    w.set(a.key, v);
  }
  w.set_f32_array("a.f32", {1.5f, -0.0f, 3e38f});
  Value f64 = array(ValueType::FLOAT64);
  f64.floats = {1e-300, -2.5};
  w.set("a.f64", f64);
  w.set_string_array("a.string", {"", "Ġthe", std::string(1000, 'x')});
  w.set_i32_array("a.empty", {});
  w.set("a.nested_empty", array(ValueType::ARRAY));

  std::vector<uint8_t> f32_data(4 * 3 * 2);
  for (size_t i = 0; i < f32_data.size(); ++i) f32_data[i] = static_cast<uint8_t>(i);
  w.add_tensor("t.f32", {3, 2}, DType::F32, f32_data);
  std::vector<uint8_t> q8(34 * 2 * 5, 0xab);
  w.add_tensor("t.q8_0", {64, 5}, DType::Q8_0, q8);
  w.add_tensor("t.f16.streamed", {2, 3, 4, 5}, DType::F16, [fills](std::span<uint8_t> out) {
    CHECK(out.size() == 2 * 3 * 4 * 5 * 2);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
    ++*fills;
  });
  return w;
}

void check_every_type(const File& f) {
  CHECK(f.version() == 3);
  CHECK(f.find("u8")->type == ValueType::UINT8);
  CHECK(f.get_int("u8", 0) == 255);
  CHECK(f.get_int("i8", 0) == -128);
  CHECK(f.get_int("u16", 0) == 65535);
  CHECK(f.get_int("i16", 0) == -32768);
  CHECK(f.get_int("u32", 0) == 4294967295LL);
  CHECK(f.get_int("i32", 0) == std::numeric_limits<int32_t>::min());
  CHECK(f.get_float("f32", 0) == static_cast<double>(0.1f));
  CHECK(f.get_bool("bool", false) == true);
  CHECK(f.get_string("string", "") == std::string("h\xc3\xa9llo\0world", 12));
  CHECK(std::get<uint64_t>(f.find("u64")->scalar) == std::numeric_limits<uint64_t>::max());
  CHECK_THROWS_AS(f.get_int("u64", 0), InputError);  // does not fit int64
  CHECK(f.get_int("i64", 0) == std::numeric_limits<int64_t>::min());
  CHECK(f.get_float("f64", 0) == 1e300);
  for (const char* type : {"u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "bool"}) {
    CHECK(f.find(std::string("a.") + type)->elem_type == f.find(type)->type);
  }
  CHECK(f.get_int_array("a.u8") == std::vector<int64_t>{0, 1, 255});
  CHECK(f.get_int_array("a.i8") == std::vector<int64_t>{-128, 0, 127});
  CHECK(f.get_int_array("a.u16") == std::vector<int64_t>{65535, 7});
  CHECK(f.get_int_array("a.i16") == std::vector<int64_t>{-32768, 32767});
  CHECK(f.get_int_array("a.u32") == std::vector<int64_t>{4294967295, 0});
  CHECK(f.get_int_array("a.i32") == std::vector<int64_t>{-2147483648LL, 5});
  CHECK(f.get_int_array("a.u64") == std::vector<int64_t>{-1, 42});
  CHECK(f.get_int_array("a.i64") == std::vector<int64_t>{std::numeric_limits<int64_t>::min()});
  CHECK(f.get_int_array("a.bool") == std::vector<int64_t>{1, 0, 1});
  CHECK(f.find("a.f32")->elem_type == ValueType::FLOAT32);
  CHECK(f.get_float_array("a.f32") == std::vector<double>{1.5, -0.0, static_cast<double>(3e38f)});
  CHECK(std::signbit(f.get_float_array("a.f32")[1]));
  CHECK(f.get_float_array("a.f64") == std::vector<double>{1e-300, -2.5});
  CHECK(f.get_string_array("a.string") == std::vector<std::string>{"", "Ġthe", std::string(1000, 'x')});
  CHECK(f.find("a.empty")->array_size() == 0);
  CHECK(f.find("a.nested_empty")->elem_type == ValueType::ARRAY);
  CHECK(f.find("a.nested_empty")->array_size() == 0);

  REQUIRE(f.tensors().size() == 3);
  const auto* t = f.tensor("t.f32");
  REQUIRE(t);
  CHECK(t->shape == std::vector<int64_t>{3, 2});
  CHECK(t->n_bytes == 24);
  for (size_t i = 0; i < 24; ++i) CHECK(t->data[i] == i);
  t = f.tensor("t.q8_0");
  REQUIRE(t);
  CHECK(t->type == DType::Q8_0);
  CHECK(t->n_elements() == 320);
  CHECK(t->n_bytes == 340);
  CHECK(std::all_of(t->data, t->data + t->n_bytes, [](uint8_t b) { return b == 0xab; }));
  t = f.tensor("t.f16.streamed");
  REQUIRE(t);
  CHECK(t->shape == std::vector<int64_t>{2, 3, 4, 5});
  for (size_t i = 0; i < t->n_bytes; ++i) CHECK(t->data[i] == static_cast<uint8_t>(i * 7));
  for (const auto& info : f.tensors()) {
    CHECK(info.offset % f.alignment() == 0);
    CHECK(f.data_offset() % f.alignment() == 0);
  }
}

std::filesystem::path temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("choreo_gguf_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("gguf: every value type and tensor survives writer -> reader, in memory and on disk") {
  for (size_t alignment : {32, 64, 1}) {
    CAPTURE(alignment);
    auto fills = std::make_shared<int>(0);
    Writer w = every_type_writer(alignment, fills);
    std::vector<uint8_t> bytes = w.to_bytes();
    CHECK(*fills == 1);  // the streaming fill runs once per serialisation
    File f = File::parse(bytes, "mem.gguf");
    check_every_type(f);
    CHECK(f.alignment() == alignment);
    CHECK(f.has("general.alignment") == (alignment != 32));

    auto dir = temp_dir();
    std::string path = (dir / "every.gguf").string();
    w.write(path);
    CHECK(read_all(path) == bytes);  // file and memory serialisations agree byte for byte
    File g = File::open(path);
    check_every_type(g);
    // Crash-safe write leaves nothing else behind.
    CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) ==
          1);
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("gguf: NaN and infinite floats survive a parse -> write -> parse round trip") {
  // Found by the fuzzer: the writer once converted every scalar to an integer, undefined for NaN.
  Writer w;
  w.set_f32("nan", std::numeric_limits<float>::quiet_NaN());
  w.set("inf", scalar(ValueType::FLOAT64, -std::numeric_limits<double>::infinity()));
  w.set_f32_array("floats", {std::numeric_limits<float>::quiet_NaN(), 1e38f});
  auto bytes = w.to_bytes();
  File f = File::parse(bytes, "nan.gguf");
  Writer copy;
  for (const auto& [key, value] : f.metadata()) copy.set(key, value);
  auto copy_bytes = copy.to_bytes();
  CHECK(copy_bytes == bytes);
  File g = File::parse(copy_bytes, "copy.gguf");
  CHECK(std::isnan(g.get_float("nan", 0)));
  CHECK(g.get_float("inf", 0) == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(g.get_float_array("floats")[0]));
  Writer misuse;
  misuse.set("i", scalar(ValueType::INT32, std::numeric_limits<double>::quiet_NaN()));
  CHECK_THROWS_AS(misuse.to_bytes(), std::invalid_argument);
}

TEST_CASE("gguf: the writer's bytes equal an independent encoding of the same content") {
  Writer w;
  w.set_u32("general.x", 7);
  w.add_tensor("a", {8}, DType::F32, std::vector<uint8_t>(32, 1));
  w.add_tensor("b", {3}, DType::F32, std::vector<uint8_t>(12, 2));
  w.add_tensor("c", {32}, DType::Q4_0, std::vector<uint8_t>(18, 3));
  Raw r;
  r.header(3, 1).kv_u32("general.x", 7);
  r.tensor("a", {8}, 0, 0).tensor("b", {3}, 0, 32).tensor("c", {32}, 2, 64).pad();
  r.fill(32, 1).fill(12, 2);
  r.zeros(20);
  r.fill(18, 3);
  CHECK(w.to_bytes() == r.bytes);
}

TEST_CASE("gguf: writer rejects misuse and a failed write leaves the old file intact") {
  Writer w;
  CHECK_THROWS_AS(w.add_tensor("x", {31}, DType::Q8_0, std::vector<uint8_t>(34)), std::invalid_argument);
  CHECK_THROWS_AS(w.add_tensor("x", {4}, DType::F32, std::vector<uint8_t>(15)), std::invalid_argument);
  CHECK_THROWS_AS(w.add_tensor("x", {0}, DType::F32, std::vector<uint8_t>()), std::invalid_argument);
  w.add_tensor("x", {4}, DType::F32, std::vector<uint8_t>(16));
  CHECK_THROWS_AS(w.add_tensor("x", {4}, DType::F32, std::vector<uint8_t>(16)), std::invalid_argument);
  CHECK(w.to_bytes().size() > 0);

  auto dir = temp_dir();
  std::string path = (dir / "keep.gguf").string();
  w.write(path);
  auto before = read_all(path);
  Writer failing;
  failing.add_tensor("boom", {4}, DType::F32,
                     [](std::span<uint8_t>) { throw std::runtime_error("fill failed"); });
  CHECK_THROWS_WITH_AS(failing.write(path), "fill failed", std::runtime_error);
  CHECK(read_all(path) == before);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  CHECK_THROWS_AS(w.write((dir / "no_such_dir" / "x.gguf").string()), InputError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("gguf: stories260K metadata and tensor shapes agree with its published dimensions") {
  File f = File::open(choreo::testing::shared_file("models/stories260K.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.require_string("general.architecture") == "llama");
  const int64_t dim = f.require_int("llama.embedding_length");
  const int64_t layers = f.require_int("llama.block_count");
  const int64_t heads = f.require_int("llama.attention.head_count");
  const int64_t kv_heads = f.require_int("llama.attention.head_count_kv");
  const int64_t ffn = f.require_int("llama.feed_forward_length");
  CHECK(dim == 64);
  CHECK(layers == 5);
  CHECK(heads == 8);
  CHECK(kv_heads == 4);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon", 0) == doctest::Approx(1e-5));
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  CHECK(tokens.size() == 512);  // README: vocab 512 SentencePiece
  CHECK(f.get_float_array("tokenizer.ggml.scores").size() == 512);
  CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == 512);
  CHECK(f.get_int("tokenizer.ggml.bos_token_id", -1) == 1);
  CHECK(tokens[1] == "<s>");

  // Global tensors + 9 per layer, every one F32 with the size its shape implies.
  CHECK(f.tensors().size() == static_cast<size_t>(3 + 9 * layers));
  const int64_t head_dim = dim / heads;
  auto shape = [&](const std::string& name) {
    const auto* t = f.tensor(name);
    REQUIRE_MESSAGE(t, name);
    return t->shape;
  };
  using S = std::vector<int64_t>;
  CHECK(shape("token_embd.weight") == S{dim, 512});
  CHECK(shape("output_norm.weight") == S{dim});
  for (int64_t i = 0; i < layers; ++i) {
    std::string p = "blk." + std::to_string(i) + ".";
    CHECK(shape(p + "attn_q.weight") == S{dim, heads * head_dim});
    CHECK(shape(p + "attn_k.weight") == S{dim, kv_heads * head_dim});
    CHECK(shape(p + "attn_v.weight") == S{dim, kv_heads * head_dim});
    CHECK(shape(p + "attn_output.weight") == S{heads * head_dim, dim});
    CHECK(shape(p + "ffn_gate.weight") == S{dim, ffn});
    CHECK(shape(p + "ffn_up.weight") == S{dim, ffn});
    CHECK(shape(p + "ffn_down.weight") == S{ffn, dim});
    CHECK(shape(p + "attn_norm.weight") == S{dim});
    CHECK(shape(p + "ffn_norm.weight") == S{dim});
  }
  size_t total = 0;
  for (const auto& t : f.tensors()) {
    CHECK(t.type == DType::F32);
    CHECK(t.n_bytes == static_cast<size_t>(t.n_elements()) * 4);
    total += t.n_bytes;
    const float* x = reinterpret_cast<const float*>(t.data);
    for (int64_t i = 0; i < t.n_elements(); ++i) REQUIRE(std::isfinite(x[i]));
  }
  // The tensors tile the data section exactly (up to alignment padding) to the end of the file.
  CHECK(f.data_offset() + total <= f.file_size());
  CHECK(f.file_size() - f.data_offset() - total < 32 * f.tensors().size());
}

TEST_CASE("gguf: vocab-only files (no tensor section) and the other shared models load") {
  for (const char* name : {"gpt-2", "llama-spm", "deepseek-coder", "mpt", "refact"}) {
    CAPTURE(name);
    File f =
        File::open(choreo::testing::shared_file(std::string("models/vocab/ggml-vocab-") + name + ".gguf"));
    CHECK(f.tensors().empty());
    const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
    CHECK(tokens.size() > 1000);
    CHECK(f.get_int_array("tokenizer.ggml.token_type").size() == tokens.size());
  }
  File tiny = File::open(choreo::testing::shared_file("models/llama-2-tiny-random.gguf"));
  CHECK(tiny.get_string_array("tokenizer.ggml.tokens").size() == 32000);
  CHECK(tiny.tensor("token_embd.weight")->shape ==
        std::vector<int64_t>{tiny.require_int("llama.embedding_length"), 32000});
  CHECK(tiny.tensor("token_embd.weight")->type == DType::F16);
}

TEST_CASE("gguf: typed getters name the key when the type is wrong or the key is missing") {
  Writer w;
  w.set_string("s", "x");
  w.set_f32("f", 1.0f);
  w.set_i32_array("ints", {1});
  auto bytes = w.to_bytes();
  File f = File::parse(bytes, "m.gguf");
  CHECK_THROWS_WITH_AS(f.get_int("s", 0), doctest::Contains("m.gguf: metadata key 's' has type string"),
                       InputError);
  CHECK_THROWS_WITH_AS(f.get_string("f", ""), doctest::Contains("'f'"), InputError);
  CHECK_THROWS_WITH_AS(f.get_string_array("ints"), doctest::Contains("array of int32"), InputError);
  CHECK_THROWS_WITH_AS(f.require_int("llama.block_count"),
                       doctest::Contains("'llama.block_count' is missing"), InputError);
  CHECK(f.get_int("absent", 17) == 17);
  CHECK(f.get_string_array("absent").empty());
  CHECK(f.get_float("f", 0) == 1.0);
}

TEST_CASE("gguf: every truncation of a real file is an InputError that says so") {
  const std::string path = choreo::testing::shared_file("models/stories260K.gguf");
  const std::vector<uint8_t> full = read_all(path);
  File f = File::parse(full, "full.gguf");
  size_t data_end = 0;
  for (const auto& t : f.tensors())
    data_end = std::max<size_t>(data_end, f.data_offset() + t.offset + t.n_bytes);
  REQUIRE(data_end <= full.size());
  // Every cut through the header, metadata, tensor infos and the first data; then a stride through the data.
  std::vector<size_t> cuts;
  for (size_t n = 0; n < f.data_offset() + 4096; ++n) cuts.push_back(n);
  for (size_t n = f.data_offset() + 4096; n < data_end; n += 997) cuts.push_back(n);
  cuts.push_back(data_end - 1);
  size_t failures = 0;
  for (size_t n : cuts) {
    std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    std::string error = parse_error(prefix, "cut.gguf");
    if (error.find("truncated") == std::string::npos) {
      if (failures++ < 5) FAIL_CHECK("cut at ", n, " gave: '", error, "'");
    }
  }
  CHECK(failures == 0);
  // The final tensor's error names it and both byte counts.
  std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(data_end - 1));
  std::string error = parse_error(cut, "cut.gguf");
  CHECK(error.find(fmt::format("data ends at byte {} but file has {} bytes", data_end, data_end - 1)) !=
        std::string::npos);
}

TEST_CASE("gguf: corrupt headers give specific errors") {
  CHECK(parse_error(Raw().header(0, 0).bytes).empty());  // minimal valid file
  Raw magic;
  magic.bytes = {'G', 'G', 'M', 'L', 3, 0, 0, 0};
  CHECK(parse_error(magic.bytes).find("not a GGUF file: wrong magic") != std::string::npos);
  CHECK(parse_error({}).find("truncated file: 0 bytes") != std::string::npos);
  CHECK(parse_error({'G', 'G'}).find("truncated file: 2 bytes") != std::string::npos);
  CHECK(parse_error({'P', 'K', 3}).find("wrong magic (first bytes 50 4b 03,") != std::string::npos);
  CHECK(parse_error(Raw().header(0, 0, 1).bytes).find("GGUF version 1 is not supported") !=
        std::string::npos);
  CHECK(parse_error(Raw().header(0, 0, 99).bytes).find("unsupported GGUF version 99") != std::string::npos);
  CHECK(parse_error(Raw().header(0, 0, 2).bytes).empty());  // v2 is accepted
  try {
    File::parse(Raw().header(0, 0, 0x03000000).bytes, "be.gguf");
    FAIL("big-endian file accepted");
  } catch (const InputError& e) {
    CHECK(e.hint().find("big-endian") != std::string::npos);
  }
  CHECK(parse_error(Raw().header(0, 1ull << 60).bytes)
            .find("header says 1152921504606846976 metadata entries") != std::string::npos);
  CHECK(parse_error(Raw().header(1ull << 40, 0).bytes).find("header says 1099511627776 tensors") !=
        std::string::npos);
}

TEST_CASE("gguf: corrupt metadata gives specific errors") {
  // Absurd string length: the key claims 2^62 bytes.
  Raw s;
  s.header(0, 1).put<uint64_t>(1ull << 62).zeros(16);
  CHECK(parse_error(s.bytes).find("key of metadata entry 0 has length 4611686018427387904") !=
        std::string::npos);
  // Absurd array count: refused before allocating.
  Raw a;
  a.header(0, 1)
      .str("tokenizer.ggml.tokens")
      .put<uint32_t>(9)
      .put<uint32_t>(8)
      .put<uint64_t>(1ull << 61)
      .zeros(64);
  CHECK(parse_error(a.bytes).find(
            "array of 2305843009213693952 string values for metadata key 'tokenizer.ggml.tokens'") !=
        std::string::npos);
  Raw a32;
  a32.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(5).zeros(
      16);  // 5 u32 need 20 bytes
  CHECK(parse_error(a32.bytes).find("array of 5 uint32 values") != std::string::npos);
  Raw nested;
  nested.header(0, 1)
      .str("k")
      .put<uint32_t>(9)
      .put<uint32_t>(9)
      .put<uint64_t>(1)
      .put<uint32_t>(4)
      .put<uint64_t>(0);
  CHECK(parse_error(nested.bytes).find("nested array") != std::string::npos);
  Raw type;
  type.header(0, 1).str("k").put<uint32_t>(13).zeros(8);
  CHECK(parse_error(type.bytes).find("metadata key 'k' has unknown value type 13") != std::string::npos);
  Raw elem;
  elem.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(200).put<uint64_t>(0);
  CHECK(parse_error(elem.bytes).find("unknown element type 200") != std::string::npos);
  Raw dup;
  dup.header(0, 2).kv_u32("a", 1).kv_u32("a", 2);
  CHECK(parse_error(dup.bytes).find("duplicate metadata key 'a'") != std::string::npos);
  Raw boolean;
  boolean.header(0, 1).str("flag").put<uint32_t>(7).put<uint8_t>(2);
  CHECK(parse_error(boolean.bytes).find("invalid byte value 2") != std::string::npos);
  for (uint32_t alignment : {0u, 3u, 48u}) {
    Raw al;
    al.header(0, 1).kv_u32("general.alignment", alignment);
    CHECK(parse_error(al.bytes).find("general.alignment must be a power of two") != std::string::npos);
  }
}

TEST_CASE("gguf: corrupt tensor infos and data offsets give specific errors") {
  auto one_tensor = [](std::vector<int64_t> shape, uint32_t type, uint64_t offset, size_t data_bytes) {
    Raw r;
    r.header(1, 0).tensor("blk.0.attn_q.weight", std::move(shape), type, offset).pad().zeros(data_bytes);
    return r.bytes;
  };
  CHECK(parse_error(one_tensor({4, 2}, 0, 0, 32)).empty());
  CHECK(
      parse_error(one_tensor({1ll << 40, 1ll << 40}, 0, 0, 32))
          .find(
              "tensor 'blk.0.attn_q.weight' has absurd dimensions 1099511627776 x 1099511627776: the element "
              "count overflows") != std::string::npos);
  CHECK(parse_error(one_tensor({4, -2}, 0, 0, 32)).find("every dimension must be positive") !=
        std::string::npos);
  CHECK(parse_error(one_tensor({4, 0}, 0, 0, 32)).find("every dimension must be positive") !=
        std::string::npos);
  CHECK(parse_error(one_tensor({1, 1, 1, 1, 1}, 0, 0, 32)).find("has 5 dimensions; at most 4") !=
        std::string::npos);
  CHECK(parse_error(one_tensor({4, 2}, 77, 0, 32))
            .find("tensor 'blk.0.attn_q.weight' has unknown type id 77") != std::string::npos);
  CHECK(parse_error(one_tensor({4, 2}, 4, 0, 32)).find("unknown type id 4") !=
        std::string::npos);  // removed Q4_2
  CHECK(parse_error(one_tensor({48, 2}, 8, 0, 128))
            .find("row of 48 elements is not a multiple of the Q8_0 block size 32") != std::string::npos);
  std::string beyond = parse_error(one_tensor({4, 2}, 0, 1 << 20, 32));
  CHECK(beyond.find("truncated file: tensor 'blk.0.attn_q.weight' data ends at byte") != std::string::npos);
  CHECK(parse_error(one_tensor({4, 2}, 0, ~0ull - 31, 32)).find("data ends beyond 2^64") !=
        std::string::npos);
  CHECK(parse_error(one_tensor({4, 2}, 0, 8, 64))
            .find("data offset 8 is misaligned (not a multiple of the alignment 32)") != std::string::npos);
  CHECK(parse_error(one_tensor({4, 2}, 0, 0, 31)).find("truncated file") != std::string::npos);

  Raw dup;
  dup.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64);
  CHECK(parse_error(dup.bytes).find("duplicate tensor name 'w'") != std::string::npos);
  Raw overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().zeros(64);
  CHECK(parse_error(overlap.bytes)
            .find("tensors 'a' (bytes 0..64 of the data section) and 'b' (from byte 32) overlap") !=
        std::string::npos);
  Raw no_data;
  no_data.header(1, 0).tensor("a", {8}, 0, 0);
  CHECK(parse_error(no_data.bytes).find("truncated file") != std::string::npos);

  // A custom alignment moves the data section and governs offsets.
  Raw aligned;
  aligned.header(1, 1).kv_u32("general.alignment", 256).tensor("a", {8}, 0, 0).pad(256).zeros(32);
  File f = File::parse(aligned.bytes, "a.gguf");
  CHECK(f.alignment() == 256);
  CHECK(f.data_offset() == 256);
  Raw misaligned;
  misaligned.header(1, 1).kv_u32("general.alignment", 256).tensor("a", {8}, 0, 32).pad(256).zeros(64);
  CHECK(parse_error(misaligned.bytes).find("not a multiple of the alignment 256") != std::string::npos);
}

TEST_CASE("gguf: open reports missing and non-GGUF files by path") {
  CHECK_THROWS_WITH_AS(File::open("/nonexistent/model.gguf"),
                       doctest::Contains("/nonexistent/model.gguf: cannot open: No such file"), InputError);
  auto dir = temp_dir();
  std::string empty = (dir / "empty.gguf").string();
  std::ofstream(empty).close();
  CHECK_THROWS_WITH_AS(File::open(empty), doctest::Contains("empty.gguf: empty file"), InputError);
  CHECK_THROWS_WITH_AS(File::open(dir.string()), doctest::Contains("a directory, not a GGUF file"), InputError);
  std::filesystem::remove_all(dir);
}

TEST_SUITE("hostile") {
  /// stories260K rewritten by the Writer with `llama.context_length` replaced by `value`, loaded as a model;
  /// returns the model's context.
  int load_with_context_length(const Value& value, const std::filesystem::path& path) {
    File source = File::open(choreo::testing::shared_file("models/stories260K.gguf"));
    Writer w(source.alignment());
    bool replaced = false;
    for (const auto& [key, v] : source.metadata()) {
      replaced |= key == "llama.context_length";
      w.set(key, key == "llama.context_length" ? value : v);
    }
    REQUIRE(replaced);  // not vacuous: the real file has the key
    for (const auto& t : source.tensors())
      w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    w.write(path.string());
    auto backend = choreo::kernels::make_cpu_backend(1);
    return choreo::model::Model::load(path.string(), *backend)->config().n_ctx_train;
  }

  TEST_CASE("gguf: a context_length beyond int range is an InputError naming the file and key, not a wrap") {
    auto dir = temp_dir();
    const auto path = dir / "ctx.gguf";
    // Control: an ordinary value loads and is the model's context.
    CHECK(load_with_context_length(scalar(ValueType::UINT32, uint64_t{4096}), path) == 4096);
    // 2^32 + 16 once became a context of 16, 3e9 (u32) a negative one; 2^31 - 1 is past the accepted maximum.
    for (const Value& v :
         {scalar(ValueType::UINT64, (uint64_t{1} << 32) + 16),
          scalar(ValueType::UINT32, uint64_t{3'000'000'000}), scalar(ValueType::INT32, int64_t{2147483647}),
          scalar(ValueType::INT64, int64_t{-5}), scalar(ValueType::UINT32, uint64_t{0}),
          scalar(ValueType::UINT64, ~uint64_t{0})}) {
      CAPTURE(v.to_string());
      const std::string expected = path.string() + ": metadata key 'llama.context_length' = ";
      CHECK_THROWS_WITH_AS(load_with_context_length(v, path), doctest::Contains(expected.c_str()),
                           InputError);
    }
    std::filesystem::remove_all(dir);
  }
}
