// safetensors: the byte layout, round trips, and the refusals (truncation, corruption, shape and dtype
// mismatch, hostile headers) with messages that name the file and the tensor.
#include "runtime/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/scratch.h"
#include "tests/error_message.h"

namespace ddp {
namespace io {
namespace {

using ::ddp::testing::error_message;

struct Fixture {
  std::vector<float> w = {1, 2, 3, 4, 5, 6};
  std::vector<float> b = {0.5f, -0.5f};
  std::vector<int64_t> step = {7};
  std::vector<uint16_t> half = {0x3f80, 0x4000};
  std::vector<TensorSource> tensors() const {
    return {{"0.weight", DType::kFloat32, {2, 3}, w.data(), w.size() * 4},
            {"0.bias", DType::kFloat32, {2}, b.data(), b.size() * 4},
            {"optimizer.step", DType::kInt64, {1}, step.data(), 8},
            {"h", DType::kBFloat16, {2}, half.data(), 4},
            {"empty", DType::kInt32, {0, 3}, nullptr, 0}};
  }
};

TEST(Safetensors, LayoutIsTheSpec) {
  Fixture f;
  const std::string bytes = encode_safetensors(f.tensors(), {{"note", "hi"}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);  // data section aligned
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["0.weight"]["dtype"], "F32");
  EXPECT_EQ(header["0.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["0.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["0.bias"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(header["h"]["dtype"], "BF16");
  EXPECT_EQ(header["__metadata__"]["note"], "hi");
  EXPECT_EQ(header["__metadata__"]["ddp.crc32:0.weight"], crc32_hex(f.w.data(), 24));
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 8 + 8 + 4);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
}

// A tensor whose bytes a producer appends piece by piece (as a sharded optimizer's state gathered from the
// ranks) gives the bytes of the same tensor given whole, checksum included; in a file too.
TEST(Safetensors, ProducedTensorsGiveTheBytesOfWholeOnes) {
  Fixture f;
  std::vector<TensorSource> lazy = f.tensors();
  lazy[0].data = nullptr;
  lazy[0].produce = [&f](const ByteSink& sink) {
    sink(f.w.data(), 8);
    sink(f.w.data() + 2, 16);
  };
  const std::string want = encode_safetensors(f.tensors(), {{"note", "hi"}});
  EXPECT_EQ(encode_safetensors(lazy, {{"note", "hi"}}), want);
  const std::string path = ddp::testing::scratch_path("produced.safetensors");
  save_safetensors(path, lazy, {{"note", "hi"}});
  EXPECT_EQ(read_file(path), want);
  const SafetensorsFile file = load_safetensors(path, ReadOptions{true});
  std::vector<float> w(6);
  file.copy_to("0.weight", DType::kFloat32, {2, 3}, w.data());
  EXPECT_EQ(w, f.w);

  lazy[0].produce = [&f](const ByteSink& sink) { sink(f.w.data(), 20); };
  EXPECT_NE(
      error_message<InvalidArgument>([&] { encode_safetensors(lazy, {}); }).find("the producer wrote 20 bytes of 24"),
      std::string::npos);
  lazy[0].produce = nullptr;
  EXPECT_NE(error_message<InvalidArgument>([&] { encode_safetensors(lazy, {}); }).find("0.weight: no data"),
            std::string::npos);
}

TEST(Safetensors, RoundTripThroughAFile) {
  Fixture f;
  const std::string path = ddp::testing::scratch_path("round.safetensors");
  save_safetensors(path, f.tensors(), {{"step", "7"}});
  ReadOptions strict;
  strict.require_checksums = true;
  const SafetensorsFile file = load_safetensors(path, strict);
  EXPECT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.metadata().at("step"), "7");
  std::vector<float> w(6);
  file.copy_to("0.weight", DType::kFloat32, {2, 3}, w.data());
  EXPECT_EQ(w, f.w);
  std::vector<int64_t> s(1);
  file.copy_to("optimizer.step", DType::kInt64, {1}, s.data());
  EXPECT_EQ(s[0], 7);
  EXPECT_EQ(file.at("empty").shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(file.find("nope"), nullptr);
}

TEST(Safetensors, ShapeAndDtypeMismatchNameFileAndTensor) {
  Fixture f;
  const std::string path = ddp::testing::scratch_path("mismatch.safetensors");
  save_safetensors(path, f.tensors(), {});
  ReadOptions o;
  o.kind = "checkpoint";
  const SafetensorsFile file = load_safetensors(path, o);
  std::vector<float> out(100);
  EXPECT_NE(error_message<InvalidArgument>([&] { file.copy_to("0.weight", DType::kFloat32, {2, 5}, out.data()); })
                .find("checkpoint " + path + ": tensor 0.weight: shape [2,3] does not match the model's [2,5]"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] { file.copy_to("0.bias", DType::kBFloat16, {2}, out.data()); })
                .find("tensor 0.bias: dtype F32 does not match the model's BF16"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] { file.copy_to("4.weight", DType::kFloat32, {2}, out.data()); })
                .find("tensor 4.weight: missing from the file"),
            std::string::npos);
}

TEST(Safetensors, RefusesTruncation) {
  Fixture f;
  const std::string bytes = encode_safetensors(f.tensors(), {});
  const std::string cut = bytes.substr(0, bytes.size() - 10);
  const std::string e = error_message<InvalidArgument>([&] { parse_safetensors(cut, "/x/ckpt.safetensors"); });
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const size_t data = bytes.size() - 8 - n;
  EXPECT_NE(e.find("/x/ckpt.safetensors: truncated: header says " + std::to_string(data) +
                   " bytes of data, file has " + std::to_string(data - 10)),
            std::string::npos)
      << e;
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_safetensors(bytes.substr(0, 5), "f"); }).find("truncated"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(bytes.substr(0, 40), "f");
            }).find("truncated: header says"),
            std::string::npos);
}

TEST(Safetensors, RefusesCorruptedData) {
  Fixture f;
  std::string bytes = encode_safetensors(f.tensors(), {});
  bytes[bytes.size() - 12] ^= 0x01;  // inside 0.bias / optimizer.step region
  const std::string e = error_message<InvalidArgument>([&] { parse_safetensors(bytes, "/x/c.safetensors"); });
  EXPECT_NE(e.find("/x/c.safetensors: tensor optimizer.step: checksum mismatch"), std::string::npos) << e;
}

TEST(Safetensors, RefusesTrailingBytesAndGaps) {
  Fixture f;
  const std::string bytes = encode_safetensors(f.tensors(), {});
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_safetensors(bytes + "xx", "f"); }).find("wrong length"),
            std::string::npos);
  const std::string gap = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(gap.size());
  file += gap + "zz";
  EXPECT_NE(
      error_message<InvalidArgument>([&] { parse_safetensors(file, "f"); }).find("tensor a: data starts at byte 1"),
      std::string::npos);
}

std::string with_header(const std::string& header, const std::string& data = "") {
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(&file[0], &n, 8);
  return file + header + data;
}

TEST(Safetensors, RefusesHostileHeaders) {
  EXPECT_NE(
      error_message<InvalidArgument>([&] { parse_safetensors(with_header("not json"), "f"); }).find("not valid JSON"),
      std::string::npos);
  EXPECT_NE(
      error_message<InvalidArgument>([&] { parse_safetensors(with_header("[1,2]"), "f"); }).find("not a JSON object"),
      std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(with_header(R"({"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}})", "a"), "f");
            }).find("tensor t: unknown dtype \"Q9\""),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(with_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
                                "f");
            }).find("tensor t: shape"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"),
                                "f");
            }).find("tensor t: shape [2] of F32 does not fit its 4 bytes"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(
                  with_header(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})",
                              "abcd"),
                  "f");
            }).find("does not fit"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(with_header(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[3,1]}})", "a"), "f");
            }).find("end before they begin"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_safetensors(with_header(R"({"__metadata__":{"a":1}})"), "f"); })
                .find("not a string"),
            std::string::npos);
  // A header length far beyond the cap is refused before any allocation.
  std::string huge(8, '\xff');
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_safetensors(huge, "f"); }).find("exceeds the limit"),
            std::string::npos);
  // Deep nesting is just invalid structure, not a stack overflow.
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_safetensors(with_header(std::string(5000, '[') + std::string(5000, ']')), "f");
            }).find("not a JSON object"),
            std::string::npos);
}

TEST(Safetensors, ChecksumsRequiredWhenAsked) {
  const std::string file = with_header(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a");
  EXPECT_NO_THROW(parse_safetensors(file, "f"));  // a file from PyTorch has none
  ReadOptions strict;
  strict.require_checksums = true;
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_safetensors(file, "f", strict); }).find("tensor t: no checksum"),
            std::string::npos);
}

TEST(Safetensors, WriterRefusesBadInput) {
  std::vector<float> x(4);
  EXPECT_THROW(encode_safetensors({{"a", DType::kFloat32, {3}, x.data(), 16}}, {}), InvalidArgument);
  EXPECT_THROW(encode_safetensors({{"a", DType::kFloat32, {4}, x.data(), 16}, {"a", DType::kFloat32, {4}, x.data(), 16}}, {}),
               InvalidArgument);
  EXPECT_THROW(encode_safetensors({{"__metadata__", DType::kFloat32, {4}, x.data(), 16}}, {}), InvalidArgument);
  EXPECT_THROW(encode_safetensors({}, {{"ddp.crc32:a", "0"}}), InvalidArgument);
}

}  // namespace
}  // namespace io
}  // namespace ddp
