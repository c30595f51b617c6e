#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/io/safetensors.h"
#include "common/io/safetensors_writer.h"
#include "tests/support/scratch_dir.h"

using namespace k3;
using k3::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

// Bytes 0..n-1 filled with a pattern unique to `salt`, so mixed-up tensors are visible.
Tensor patterned(Shape shape, DType dtype, int salt) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  auto* p = t.ptr<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 31 + salt * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// A hand-made file: 8-byte length (or `length_override`), header text, data bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> length_override = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = length_override.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
  out << header;
  out << std::string(data_bytes, '\x5a');
}

std::string error_of(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  REQUIRE_FALSE(f.is_ok());
  return f.status().message();
}

}  // namespace

TEST_CASE("safetensors round trip keeps every dtype, shape, byte and the metadata") {
  ScratchDir dir("io_test");
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a.bf16", patterned({3, 5}, DType::BF16, 1)},  {"b.f32", patterned({7}, DType::F32, 2)},
      {"c.f16", patterned({2, 1, 3}, DType::F16, 3)}, {"d.i32", patterned({4, 2}, DType::I32, 4)},
      {"e.i64", patterned({3}, DType::I64, 5)},       {"f.u8", patterned({5, 3}, DType::U8, 6)},
      {"g.scalar", patterned({}, DType::F32, 7)},     {"h.empty", patterned({0, 4}, DType::BF16, 8)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "k3 test"}};
  REQUIRE(write_safetensors(dir.file("m.safetensors"), tensors, meta).is_ok());
  REQUIRE_FALSE(fs::exists(dir.file("m.safetensors.tmp")));

  // Header length: a multiple of 8 so the data section starts aligned.
  std::ifstream in(dir.file("m.safetensors"), std::ios::binary);
  uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  REQUIRE(len % 8 == 0);

  auto f = SafetensorsFile::open(dir.file("m.safetensors"));
  REQUIRE(f.is_ok());
  REQUIRE(f->metadata() == meta);
  REQUIRE(f->entries().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    auto got = f->tensor(name);
    REQUIRE(got.is_ok());
    REQUIRE(same_bytes(*got, t));
    if (got->nbytes()) {
      REQUIRE(reinterpret_cast<uintptr_t>(got->data()) % dtype_size(got->dtype()) == 0);
      // Zero-copy: the view points into the mapping, which the tensor keeps alive.
      REQUIRE(got->owner() != nullptr);
    }
  }
  REQUIRE_FALSE(f->tensor("nope").is_ok());
  REQUIRE_THAT(f->tensor("nope").status().message(), Catch::Contains("'nope'"));
}

TEST_CASE("safetensors views outlive the file object") {
  ScratchDir dir("io_test");
  Tensor src = patterned({16}, DType::F32, 9);
  REQUIRE(write_safetensors(dir.file("m.safetensors"), {{"x", src}}).is_ok());
  Tensor view;
  {
    auto f = SafetensorsFile::open(dir.file("m.safetensors"));
    REQUIRE(f.is_ok());
    view = f->tensor("x").value();
  }
  REQUIRE(same_bytes(view, src));
}

TEST_CASE("safetensors reader rejects a truncated file") {
  ScratchDir dir("io_test");
  SECTION("shorter than the length field") {
    std::ofstream(dir.file("t.safetensors"), std::ios::binary) << "abc";
    REQUIRE_THAT(error_of(dir.file("t.safetensors")), Catch::Contains("truncated"));
  }
  SECTION("data cut short names the tensor") {
    REQUIRE(write_safetensors(dir.file("t.safetensors"),
                              {{"first", patterned({8}, DType::F32, 1)}, {"second", patterned({8}, DType::F32, 2)}})
                .is_ok());
    fs::resize_file(dir.file("t.safetensors"), fs::file_size(dir.file("t.safetensors")) - 4);
    const std::string msg = error_of(dir.file("t.safetensors"));
    REQUIRE_THAT(msg, Catch::Contains("'second'") && Catch::Contains("out of range"));
  }
}

TEST_CASE("safetensors reader rejects a bad header length") {
  ScratchDir dir("io_test");
  SECTION("absurdly large") {
    write_raw(dir.file("b.safetensors"), "{}", 0, uint64_t{1} << 40);
    REQUIRE_THAT(error_of(dir.file("b.safetensors")), Catch::Contains("bad header length"));
  }
  SECTION("longer than the file") {
    write_raw(dir.file("b.safetensors"), "{}      ", 0, 64);
    REQUIRE_THAT(error_of(dir.file("b.safetensors")), Catch::Contains("header length 64 exceeds"));
  }
  SECTION("too small to hold an object") {
    write_raw(dir.file("b.safetensors"), "{}", 0, 0);
    REQUIRE_THAT(error_of(dir.file("b.safetensors")), Catch::Contains("bad header length 0"));
  }
}

TEST_CASE("safetensors reader rejects offsets out of range, naming the tensor") {
  ScratchDir dir("io_test");
  write_raw(dir.file("o.safetensors"), R"({"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})", 16);
  const std::string msg = error_of(dir.file("o.safetensors"));
  REQUIRE_THAT(msg, Catch::Contains("tensor 'w'") && Catch::Contains("out of range"));
}

TEST_CASE("safetensors reader rejects overlapping tensors, naming both") {
  ScratchDir dir("io_test");
  write_raw(dir.file("o.safetensors"),
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            24);
  REQUIRE_THAT(error_of(dir.file("o.safetensors")),
               Catch::Contains("'a'") && Catch::Contains("'b'") && Catch::Contains("overlap"));
}

TEST_CASE("safetensors reader rejects a size that does not match the shape") {
  ScratchDir dir("io_test");
  write_raw(dir.file("s.safetensors"), R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16);
  REQUIRE_THAT(error_of(dir.file("s.safetensors")),
               Catch::Contains("tensor 'w'") && Catch::Contains("12 bytes") && Catch::Contains("needs 16"));
}

TEST_CASE("safetensors reader rejects an unknown dtype, naming the tensor") {
  ScratchDir dir("io_test");
  write_raw(dir.file("d.safetensors"), R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}})", 2);
  REQUIRE_THAT(error_of(dir.file("d.safetensors")), Catch::Contains("tensor 'w'") && Catch::Contains("'Q7'"));
}

TEST_CASE("safetensors reader rejects a header that is not valid JSON") {
  ScratchDir dir("io_test");
  write_raw(dir.file("j.safetensors"), R"({"w":{"dtype":"F32",)", 0);
  REQUIRE_THAT(error_of(dir.file("j.safetensors")), Catch::Contains("not valid JSON"));
}

TEST_CASE("safetensors reader rejects malformed header fields, naming them") {
  ScratchDir dir("io_test");
  SECTION("metadata value not a string") {
    write_raw(dir.file("m.safetensors"), R"({"__metadata__":{"format":3}})", 0);
    REQUIRE_THAT(error_of(dir.file("m.safetensors")), Catch::Contains("__metadata__.format"));
  }
  SECTION("negative dimension") {
    write_raw(dir.file("m.safetensors"), R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0);
    REQUIRE_THAT(error_of(dir.file("m.safetensors")), Catch::Contains("tensor 'w'") && Catch::Contains("shape"));
  }
  SECTION("missing data_offsets") {
    write_raw(dir.file("m.safetensors"), R"({"w":{"dtype":"F32","shape":[1]}})", 4);
    REQUIRE_THAT(error_of(dir.file("m.safetensors")), Catch::Contains("tensor 'w'") && Catch::Contains("data_offsets"));
  }
  SECTION("shape whose byte size overflows 64 bits") {
    write_raw(dir.file("m.safetensors"),
              R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
    REQUIRE_THAT(error_of(dir.file("m.safetensors")), Catch::Contains("tensor 'w'"));
  }
}

TEST_CASE("safetensors writer checks the declared layout") {
  ScratchDir dir("io_test");
  const std::string path = dir.file("w.safetensors");
  SECTION("wrong order, wrong shape, too early finish") {
    auto w = SafetensorsWriter::create(path, {{"a", DType::F32, {2}}, {"b", DType::BF16, {3}}});
    REQUIRE(w.is_ok());
    REQUIRE_THAT(w->write("b", patterned({3}, DType::BF16, 1)).message(), Catch::Contains("expected tensor 'a'"));
    REQUIRE_THAT(w->write("a", patterned({3}, DType::F32, 1)).message(), Catch::Contains("'a'"));
    REQUIRE(w->write("a", patterned({2}, DType::F32, 1)).is_ok());
    REQUIRE_THAT(w->finish().message(), Catch::Contains("'b'"));
  }
  SECTION("an abandoned writer leaves no file behind") {
    {
      auto w = SafetensorsWriter::create(path, {{"a", DType::F32, {2}}});
      REQUIRE(w.is_ok());
    }
    REQUIRE_FALSE(fs::exists(path));
    REQUIRE_FALSE(fs::exists(path + ".tmp"));
  }
  SECTION("duplicate names are refused") {
    auto w = SafetensorsWriter::create(path, {{"a", DType::F32, {2}}, {"a", DType::F32, {2}}});
    REQUIRE_FALSE(w.is_ok());
    REQUIRE_THAT(w.status().message(), Catch::Contains("'a'"));
  }
  SECTION("predicted size equals the written size") {
    std::vector<SafetensorsLayoutEntry> layout = {{"a", DType::U8, {3}}, {"b", DType::F32, {5}}};
    sort_layout_for_alignment(layout);
    REQUIRE(layout[0].name == "b");
    auto w = SafetensorsWriter::create(path, layout, {{"k", "v"}});
    REQUIRE(w.is_ok());
    REQUIRE(w->write("b", patterned({5}, DType::F32, 1)).is_ok());
    REQUIRE(w->write("a", patterned({3}, DType::U8, 2)).is_ok());
    REQUIRE(w->finish().is_ok());
    REQUIRE(fs::file_size(path) == w->total_bytes());
    REQUIRE(safetensors_file_size(layout, {{"k", "v"}}) == w->total_bytes());
  }
}

TEST_CASE("a sharded model directory loads through model.safetensors.index.json") {
  ScratchDir dir("io_test");
  Tensor a = patterned({4}, DType::F32, 1), b = patterned({2, 2}, DType::BF16, 2), c = patterned({3}, DType::I64, 3);
  REQUIRE(write_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", a}, {"b", b}}).is_ok());
  REQUIRE(write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c}}).is_ok());
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map",
                           {{"a", "model-00001-of-00002.safetensors"},
                            {"b", "model-00001-of-00002.safetensors"},
                            {"c", "model-00002-of-00002.safetensors"}}}};
  auto write_index = [&] { std::ofstream(dir.file("model.safetensors.index.json")) << index.dump(); };
  write_index();

  SECTION("all tensors, from the right shards") {
    auto d = open_safetensors_dir(dir.str());
    REQUIRE(d.is_ok());
    REQUIRE(d->files.size() == 2);
    REQUIRE(d->tensors.size() == 3);
    REQUIRE(same_bytes(d->tensors.at("a"), a));
    REQUIRE(same_bytes(d->tensors.at("b"), b));
    REQUIRE(same_bytes(d->tensors.at("c"), c));
  }
  SECTION("an index entry pointing at a shard without the tensor names it") {
    index["weight_map"]["c"] = "model-00001-of-00002.safetensors";
    index["weight_map"]["z"] = "model-00002-of-00002.safetensors";
    write_index();
    auto d = open_safetensors_dir(dir.str());
    REQUIRE_FALSE(d.is_ok());
    REQUIRE_THAT(d.status().message(), Catch::Contains("'c'") || Catch::Contains("'z'"));
  }
  SECTION("a tensor present in two shards is refused") {
    REQUIRE(write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c}, {"a", a}}).is_ok());
    auto d = open_safetensors_dir(dir.str());
    REQUIRE_FALSE(d.is_ok());
    REQUIRE_THAT(d.status().message(), Catch::Contains("'a'") && Catch::Contains("more than one shard"));
  }
  SECTION("a shard name outside the directory is refused") {
    index["weight_map"]["c"] = "../elsewhere.safetensors";
    write_index();
    auto d = open_safetensors_dir(dir.str());
    REQUIRE_FALSE(d.is_ok());
    REQUIRE_THAT(d.status().message(), Catch::Contains("weight_map['c']"));
  }
  SECTION("without an index, model.safetensors is read") {
    fs::remove(dir.file("model.safetensors.index.json"));
    REQUIRE(write_safetensors(dir.file("model.safetensors"), {{"only", a}}).is_ok());
    auto d = open_safetensors_dir(dir.str());
    REQUIRE(d.is_ok());
    REQUIRE(d->tensors.size() == 1);
    REQUIRE(same_bytes(d->tensors.at("only"), a));
  }
}
