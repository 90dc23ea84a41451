#include "agora/tensor/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agora/core/error.h"
#include "agora/core/file.h"
#include "safetensors_test_support.h"
#include "test_support.h"

namespace agora {
namespace safetensors_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsDType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_size(DType::kC64), 8u);
  EXPECT_EQ(dtype_name(DType::kF8_E4M3), "F8_E4M3");
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16",
                           "BF16", "I32", "U32", "F32", "F64", "C64", "I64", "U64"}) {
    const std::optional<DType> dtype = dtype_from_name(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(dtype_name(*dtype), name);
  }
  EXPECT_FALSE(dtype_from_name("f32").has_value());
  EXPECT_ERROR_WITH(parse_dtype("float32"), "unknown dtype \"float32\"", "allowed:", "BF16");
}

TEST_F(SafetensorsTest, RoundTripsDTypesShapesAndMetadata) {
  const std::vector<Spec> specs = sample_specs();
  const fs::path path = dir_ / "model.safetensors";
  write_specs(path, specs, kMetadata);

  const SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.tensors().size(), specs.size());
  EXPECT_EQ(file.metadata(), kMetadata);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorInfo& t = file.at(specs[i].name);
    EXPECT_EQ(t.dtype, specs[i].dtype);
    EXPECT_EQ(t.shape, specs[i].shape);
    EXPECT_EQ(t.num_elements(), count_of(specs[i].shape));
    expect_values(specs[i], file.bytes(t));
  }
  // Laid out in the order given, so tensors() (offset order) lists them that way. The zero-size
  // tensor shares its offset with nothing after it, so it stays last.
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(file.tensors()[i].name, specs[i].name);
  EXPECT_EQ(file.at("scalar").num_elements(), 1u);
  EXPECT_EQ(file.at("empty").num_elements(), 0u);
  EXPECT_TRUE(file.bytes(file.at("empty")).empty());
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_ERROR_WITH(file.at("lm_head.weight"), "no tensor named \"lm_head.weight\"", path.string());
}

TEST_F(SafetensorsTest, EmptyMetadataAndNoTensors) {
  const fs::path path = dir_ / "empty.safetensors";
  write_safetensors(path, {}, {});
  const std::string bytes = read_file(path);
  EXPECT_EQ(bytes, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
}

TEST_F(SafetensorsTest, HeaderIsPaddedSoDataIsAligned) {
  // Names of every length mod 8 move the end of the JSON through every residue.
  for (size_t len = 1; len <= 16; ++len) {
    const fs::path path = dir_ / "aligned.safetensors";
    write_specs(path, {{std::string(len, 'w'), DType::kF32, {3}}}, {});
    const std::string bytes = read_file(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len;
    const std::string json = bytes.substr(8, n);
    const size_t last = json.find_last_of('}');
    EXPECT_EQ(json.find_first_not_of(' ', last + 1), std::string::npos) << "padding is spaces";
    EXPECT_LT(json.size() - last - 1, 8u);
    EXPECT_EQ(SafetensorsFile::open(path).data_offset(), 8 + n);
  }
}

TEST_F(SafetensorsTest, SameInputsGiveSameBytes) {
  const std::vector<Spec> specs = sample_specs();
  write_specs(dir_ / "a.safetensors", specs, kMetadata);
  write_specs(dir_ / "b.safetensors", specs, kMetadata);
  const std::string a = read_file(dir_ / "a.safetensors");
  EXPECT_EQ(a, read_file(dir_ / "b.safetensors"));
  // The header is exactly what safetensors_header_bytes() says.
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<TensorView> views;
  for (const Spec& s : specs) buffers.push_back(make_bytes(s));
  for (size_t i = 0; i < specs.size(); ++i) {
    views.push_back({specs[i].name, specs[i].dtype, specs[i].shape, buffers[i]});
  }
  const std::string header = safetensors_header_bytes(views, kMetadata);
  EXPECT_EQ(a.substr(0, header.size()), header);
  EXPECT_NE(header.find(R"("__metadata__":{"agora":"step 7, ü","format":"pt"})"), std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[)"),
            std::string::npos)
      << header;
}

TEST_F(SafetensorsTest, OverwritesAtomicallyAndLeavesNoTemporaryFiles) {
  const fs::path path = dir_ / "model.safetensors";
  write_specs(path, {{"a", DType::kF32, {2}}}, {});
  write_specs(path, {{"b", DType::kI8, {3}}}, {});
  EXPECT_NE(SafetensorsFile::open(path).find("b"), nullptr);
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u);
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  const fs::path path = dir_ / "bad.safetensors";
  const std::vector<uint8_t> eight(8);
  auto write = [&](std::vector<TensorView> views) { write_safetensors(path, views, {}); };
  EXPECT_ERROR_WITH(write({{"w", DType::kF32, {3}, eight}}), "tensor \"w\"", "12 bytes",
                    "8 bytes were given");
  EXPECT_ERROR_WITH(write({{"w", DType::kF32, {2}, eight}, {"w", DType::kU8, {8}, eight}}),
                    "two tensors are named \"w\"");
  EXPECT_ERROR_WITH(write({{"__metadata__", DType::kU8, {8}, eight}}), "reserved");
  EXPECT_ERROR_WITH(write({{"w", DType::kU8, {-8}, eight}}), "dimension -8", "negative");
  EXPECT_ERROR_WITH(write({{"bad\xff", DType::kU8, {8}, eight}}), "not valid UTF-8");
  EXPECT_ERROR_WITH(write_safetensors(path, {}, {{"k", "\xc3"}}), "not valid UTF-8");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir_)) << "a rejected write leaves no temporary file";
}

// ---------------------------------------------------------------------------------------------
// Rejections. Files are built by hand, independently of the writer.

std::string raw_file(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{json.size()} >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\x5a');
}

SafetensorsHeader parse(const std::string& bytes) {
  return parse_safetensors(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      "bad.safetensors");
}

// A header of one tensor entry, `entry` being the JSON of its fields.
std::string one(const std::string& entry) {
  return R"({"w":{)" + entry + "}}";
}

TEST(SafetensorsParse, AcceptsHandWrittenFile) {
  // Keys in any order, offsets not in key order, whitespace, null metadata.
  const SafetensorsHeader h = parse(raw_file(
      R"( { "b": {"data_offsets": [0, 2], "shape": [2], "dtype": "U8"},)"
      R"( "a": {"dtype": "F32", "shape": [], "data_offsets": [2, 6]}, "__metadata__": null }  )",
      6));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.tensors[1].name, "a");
  EXPECT_EQ(h.tensors[1].begin, 2u);
  EXPECT_TRUE(h.metadata.empty());
}

TEST(SafetensorsParse, RejectsShortAndTruncatedFiles) {
  EXPECT_ERROR_WITH(parse(""), "bad.safetensors", "0 bytes", "8-byte header length");
  EXPECT_ERROR_WITH(parse(std::string("\x10\0\0", 3)), "3 bytes");
  const std::string good = raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), 8);
  EXPECT_NO_THROW(parse(good));
  // Cut inside the data section, then inside the header.
  EXPECT_ERROR_WITH(parse(good.substr(0, good.size() - 1)), "bad.safetensors", "tensor \"w\"",
                    "reach past the end of the data section, which has 7 bytes");
  const std::string header_length = fmt::format("header length is {} bytes", good.size() - 16);
  EXPECT_ERROR_WITH(parse(good.substr(0, 20)), header_length, "only 12 bytes follow", "truncated");
}

TEST(SafetensorsParse, RejectsHugeHeaderLength) {
  std::string bytes = raw_file("{}", 0);
  bytes[3] = '\x10';  // 0x10000002 bytes: above 100 MB
  EXPECT_ERROR_WITH(parse(bytes), "header length is 268435458 bytes", "above the limit");
  bytes[7] = '\xff';  // a length near 2^64 must not overflow 8 + N
  EXPECT_ERROR_WITH(parse(bytes), "above the limit");
}

TEST(SafetensorsParse, RejectsBadJson) {
  EXPECT_ERROR_WITH(parse(raw_file(R"({"w": )", 0)), "bad.safetensors", "not valid JSON");
  EXPECT_ERROR_WITH(parse(raw_file("", 0)), "not valid JSON");
  EXPECT_ERROR_WITH(parse(raw_file("{} x", 0)), "not valid JSON");
  EXPECT_ERROR_WITH(parse(raw_file(std::string("{}\0", 3), 0)), "NUL byte at offset 2");
  EXPECT_ERROR_WITH(parse(raw_file(std::string("{}\0\"x\":[]", 9), 0)), "NUL byte");
  EXPECT_ERROR_WITH(parse(raw_file("{\"\xff\":1}", 0)), "not valid JSON");
  EXPECT_ERROR_WITH(parse(raw_file("[]", 0)), "the header is an array", "JSON object");
  EXPECT_ERROR_WITH(parse(raw_file("7", 0)), "the header is a number");
  // Deep nesting stops at the first level that does not fit; it neither recurses nor allocates.
  EXPECT_ERROR_WITH(parse(raw_file(R"({"w":{"shape":[[[[[[[[[[[[)" + std::string(100000, '['), 0)),
                    "tensor \"w\": shape holds an array");
  EXPECT_ERROR_WITH(parse(raw_file(R"({"w":[1]})", 0)), "tensor \"w\": the entry is an array");
}

TEST(SafetensorsParse, RejectsUnknownDTypes) {
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"F33","shape":[1],"data_offsets":[0,4])"), 4)),
                    "tensor \"w\"", "unknown dtype \"F33\"", "allowed:", "BF16");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"F4","shape":[2],"data_offsets":[0,1])"), 1)),
                    "F4 packs several elements per byte");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":4,"shape":[1],"data_offsets":[0,4])"), 4)),
                    "dtype is a number", "must be a string");
}

TEST(SafetensorsParse, RejectsSizeMismatch) {
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,4])"), 4)),
                    "tensor \"w\"", "shape [2] of F32 needs 8 bytes",
                    "data_offsets [0, 4] span 4 bytes");
  // 2^32 * 2^32 * 4 bytes overflows 64 bits.
  EXPECT_ERROR_WITH(
      parse(raw_file(one(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0])"),
                     0)),
      "more bytes than 2^64");
  // A zero dimension makes the tensor empty however large the others are.
  EXPECT_NO_THROW(parse(
      raw_file(one(R"("dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0])"), 0)));
}

TEST(SafetensorsParse, RejectsBadOffsets) {
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"F32","shape":[2],"data_offsets":[8,16])"), 8)),
                    "tensor \"w\"", "data_offsets [8, 16] reach past the end", "which has 8 bytes");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[0],"data_offsets":[4,0])"), 4)),
                    "data_offsets [4, 0] begin after they end");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":[0])"), 1)),
                    "data_offsets has 1 numbers");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":[0,1,2])"), 1)),
                    "more than two numbers");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":[-1,0])"), 1)),
                    "offsets cannot be negative");
  EXPECT_ERROR_WITH(
      parse(
          raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616])"), 1)),
      "data_offsets has the number");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":"0-1")"), 1)),
                    "data_offsets is a string");
}

TEST(SafetensorsParse, RejectsOverlapsHolesAndUncoveredBytes) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_ERROR_WITH(
      parse(raw_file("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
      "bad.safetensors", "tensors \"a\" at [0, 8) and \"b\" at [4, 12) overlap");
  EXPECT_ERROR_WITH(
      parse(raw_file("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)),
      "overlap");
  EXPECT_ERROR_WITH(
      parse(raw_file("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16)),
      "bytes [8, 12) of the data section, before tensor \"b\", belong to no tensor", "holes");
  EXPECT_ERROR_WITH(parse(raw_file("{" + a + "}", 10)),
                    "bytes [8, 10) at the end of the data section belong to no tensor");
  EXPECT_ERROR_WITH(parse(raw_file("{}", 1)), "bytes [0, 1)");
  // A zero-size tensor inside another one overlaps it, as in the reference.
  EXPECT_ERROR_WITH(
      parse(raw_file("{" + a + R"(,"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8)),
      "overlap");
}

TEST(SafetensorsParse, RejectsDuplicates) {
  const std::string w = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_ERROR_WITH(parse(raw_file(R"({"w":)" + w + R"(,"w":)" + w + "}", 1)), "bad.safetensors",
                    "the tensor \"w\" twice");
  EXPECT_ERROR_WITH(parse(raw_file(R"({"__metadata__":{},"w":)" + w + R"(,"__metadata__":{}})", 1)),
                    "__metadata__ twice");
  EXPECT_ERROR_WITH(parse(raw_file(R"({"__metadata__":{"k":"a","k":"b"}})", 0)),
                    "__metadata__ has the key \"k\" twice");
  EXPECT_ERROR_WITH(
      parse(raw_file(one(R"("dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1])"), 1)),
      "the entry has dtype twice");
}

TEST(SafetensorsParse, RejectsNonStringMetadata) {
  EXPECT_ERROR_WITH(parse(raw_file(R"({"__metadata__":{"step":7}})", 0)), "bad.safetensors",
                    "__metadata__ key \"step\" has a number", "metadata values must be strings");
  EXPECT_ERROR_WITH(parse(raw_file(R"({"__metadata__":{"a":{"b":"c"}}})", 0)), "has an object");
  EXPECT_ERROR_WITH(parse(raw_file(R"({"__metadata__":["a"]})", 0)), "__metadata__ is an array",
                    "object mapping strings to strings");
  const SafetensorsHeader h = parse(raw_file(R"({"__metadata__":{"a":"1","b":""}})", 0));
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"a", "1"}, {"b", ""}}));
}

TEST(SafetensorsParse, RejectsBadShapesAndEntries) {
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[-1],"data_offsets":[0,0])"), 0)),
                    "tensor \"w\"", "dimension -1", "cannot be negative");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":[1.0],"data_offsets":[0,1])"), 1)),
                    "shape has the number 1.0");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","shape":["1"],"data_offsets":[0,1])"), 1)),
                    "shape holds a string");
  EXPECT_ERROR_WITH(parse(raw_file(one(R"("dtype":"U8","data_offsets":[0,1])"), 1)),
                    "the entry has no shape");
  EXPECT_ERROR_WITH(
      parse(raw_file(one(R"("dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0)"), 1)),
      "unknown field \"x\"", "exactly dtype, shape and data_offsets");
  std::string deep = "[";
  for (int i = 0; i < 65; ++i) deep += i == 0 ? "1" : ",1";
  EXPECT_ERROR_WITH(
      parse(raw_file(one(R"("dtype":"U8","shape":)" + deep + R"(],"data_offsets":[0,1])"), 1)),
      "more than 64 dimensions");
}

TEST(SafetensorsParse, EscapesAndShortensHostileNames) {
  const std::string name = "evil\n\x1b[31m" + std::string(500, 'x');
  const std::string json =
      nlohmann::json({{name, {{"dtype", "F99"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}).dump();
  try {
    parse(raw_file(json, 1));
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    EXPECT_NE(message.find("evil\\x0a\\x1b[31m"), std::string::npos) << message;
    EXPECT_LT(message.size(), 400u) << message;
  }
}

TEST_F(SafetensorsTest, OpenNamesTheFile) {
  EXPECT_ERROR_WITH(SafetensorsFile::open(dir_ / "missing.safetensors"), "cannot open",
                    "missing.safetensors");
  write_file_atomic(dir_ / "empty.safetensors", "");
  EXPECT_ERROR_WITH(SafetensorsFile::open(dir_ / "empty.safetensors"), "empty.safetensors",
                    "0 bytes");
  write_file_atomic(dir_ / "bad.safetensors", raw_file(R"({"__metadata__":{"k":1}})", 0));
  EXPECT_ERROR_WITH(SafetensorsFile::open(dir_ / "bad.safetensors"),
                    (dir_ / "bad.safetensors").string(), "metadata values must be strings");
  EXPECT_ERROR_WITH(SafetensorsFile::open(dir_), "not a regular file");
}

}  // namespace
}  // namespace safetensors_test
}  // namespace agora
