// Malformed model files: every one must give a vitlens::Error whose one-line message names the
// file and, where there is one, the tensor or config key. Never a crash, never another exception.
//
// Each bad file is made here from a valid tiny model (safetensors_bytes of a config and tensors
// that load), with one thing broken, and written to a temporary folder: no binary junk in git.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "core/base/error.hpp"
#include "models/model_io.hpp"
#include "models/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using nlohmann::json;

// A fresh folder (test_support.hpp's temp_dir), removed with everything in it when the test ends.
struct TempDir {
  fs::path path = vitlens::test::temp_dir("safetensors-errors");
  TempDir() = default;
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// D = 8, H = 2, d = 4, P = 2, one block, 4x4 image (2x2 grid), class token, Hm = 16.
vitlens::VitConfig tiny_config() {
  vitlens::VitConfig c = vitlens::test::vit_config("tiny", 2, 8, 2, 1, 4);  // class token, qkv bias
  c.description = "safetensors error tests";
  return c;
}

vitlens::TensorData tensor_of_shape(const std::vector<int64_t>& shape, float base) {
  vitlens::TensorData t;
  t.shape = shape;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  t.values.resize(n);
  for (size_t i = 0; i < n; ++i) t.values[i] = base + 0.01f * static_cast<float>(i % 37);
  return t;
}

vitlens::TensorMap tiny_tensors(const vitlens::VitConfig& config) {
  return vitlens::test::random_tensors(config, 7);
}

std::string model_bytes(const json& config, const vitlens::TensorMap& tensors) {
  vitlens::SafetensorsFile file;
  file.tensors = tensors;
  file.metadata["config"] = config.dump();
  return vitlens::safetensors_bytes(file);
}

std::string valid_bytes() {
  const vitlens::VitConfig config = tiny_config();
  return model_bytes(vitlens::config_to_json(config), tiny_tensors(config));
}

// A safetensors file split into its parsed JSON header and its data bytes, for editing.
struct RawFile {
  json header;
  std::string data;
};

uint64_t read_le64(const std::string& bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  return v;
}

std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

RawFile split(const std::string& bytes) {
  REQUIRE(bytes.size() >= 8);
  const uint64_t n = read_le64(bytes);
  REQUIRE(n <= bytes.size() - 8);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

std::string join_text(const std::string& header_text, const std::string& data) {
  return le64(header_text.size()) + header_text + data;
}

std::string join(const RawFile& raw) { return join_text(raw.header.dump(), raw.data); }

// Loads `bytes` as the model file `name` in `dir` and checks that it fails with a one-line
// vitlens::Error naming the file and every string in `must_name`. Failures are recorded and the
// test goes on with the next case. Returns the message ("" when there was no vitlens::Error).
std::string expect_load_error(const TempDir& dir, const std::string& name, const std::string& bytes,
                              const std::vector<std::string>& must_name = {}) {
  const std::string path = dir.file(name + ".safetensors");
  write_bytes(path, bytes);
  INFO("malformed file '" << name << "'");
  std::string message;
  try {
    (void)vitlens::load_model(path);
    FAIL_CHECK("loaded without an error");
    return message;
  } catch (const vitlens::Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw " << typeid(e).name() << " instead of vitlens::Error: " << e.what());
    return message;
  }
  CHECK_THAT(message, Contains(path));
  for (const std::string& part : must_name) CHECK_THAT(message, Contains(part));
  CHECK(message.find('\n') == std::string::npos);  // one line
  return message;
}

// The valid tiny model with one edit to its parsed header.
template <typename Edit>
std::string with_header_edit(Edit edit) {
  RawFile raw = split(valid_bytes());
  edit(raw.header);
  return join(raw);
}

// The valid tiny model with one edit to its config JSON (before it is dumped into the metadata).
template <typename Edit>
std::string with_config_edit(Edit edit) {
  const vitlens::VitConfig config = tiny_config();
  json j = vitlens::config_to_json(config);
  edit(j);
  return model_bytes(j, tiny_tensors(config));
}

// The valid tiny model with one edit to its tensors.
template <typename Edit>
std::string with_tensor_edit(Edit edit) {
  const vitlens::VitConfig config = tiny_config();
  vitlens::TensorMap tensors = tiny_tensors(config);
  edit(tensors);
  return model_bytes(vitlens::config_to_json(config), tensors);
}

}  // namespace

TEST_CASE("the tiny model the error cases start from loads", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("valid.safetensors");
  write_bytes(path, valid_bytes());
  const vitlens::VitModel model = vitlens::load_model(path);
  CHECK(model.config.embed_dim == 8);
  CHECK(model.config.num_heads == 2);
  CHECK(model.w.blocks.size() == 1);

  // save_model writes the same kind of file, and what it writes loads back bit for bit.
  const vitlens::VitConfig config = tiny_config();
  const vitlens::TensorMap tensors = tiny_tensors(config);
  const std::string saved = dir.file("saved.safetensors");
  vitlens::save_model(saved, config, tensors);
  const vitlens::SafetensorsFile file = vitlens::read_safetensors(saved);
  for (const auto& [name, tensor] : tensors) {
    INFO("tensor " << name);
    REQUIRE(file.tensors.count(name) == 1);
    CHECK(file.tensors.at(name).shape == tensor.shape);
    CHECK(file.tensors.at(name).values == tensor.values);
  }
}

TEST_CASE("malformed safetensors containers give an error naming the file", "[safetensors]") {
  TempDir dir;
  const RawFile valid = split(valid_bytes());
  const std::string header_text = valid.header.dump();

  SECTION("missing file and a folder") {
    const std::string missing = dir.file("no_such_model.safetensors");
    REQUIRE_THROWS_WITH(vitlens::load_model(missing), Contains(missing));
    const std::string folder = dir.file("a_folder.safetensors");
    fs::create_directories(folder);
    REQUIRE_THROWS_WITH(vitlens::load_model(folder), Contains(folder));
  }
  SECTION("empty file") { expect_load_error(dir, "empty", ""); }
  SECTION("shorter than the 8-byte header length") {
    expect_load_error(dir, "five_bytes", std::string("\x10\x00\x00\x00\x00", 5));
    expect_load_error(dir, "seven_bytes", le64(0).substr(0, 7));
  }
  SECTION("header length past the end of the file") {
    expect_load_error(dir, "len_past_end", le64(header_text.size() + 1) + header_text);
    expect_load_error(dir, "len_huge", le64(uint64_t{1} << 40) + header_text + valid.data);
    // 8 + length wraps around in 64 bits: must not be taken as a small length.
    expect_load_error(dir, "len_wraps", le64(~uint64_t{0} - 3) + header_text + valid.data);
  }
  SECTION("an array among __metadata__'s strings, after a tensor's shape (found by fuzz_model)") {
    const std::string header = "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                               "\"__metadata__\":{\"config\":\"x\",\"shape\":[12]}}";
    expect_load_error(dir, "metadata_array", join_text(header, std::string(4, '\0')), {"__metadata__", "shape"});
    const std::string offsets = "{\"a.weight\":{\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[1]},"
                                "\"__metadata__\":{\"data_offsets\":[0,4]}}";
    expect_load_error(dir, "metadata_offsets", join_text(offsets, std::string(4, '\0')), {"__metadata__", "data_offsets"});
  }
  SECTION("header not JSON") {
    expect_load_error(dir, "not_json", join_text("{\"norm.weight\": {", valid.data), {"JSON"});
    expect_load_error(dir, "zero_length_header", join_text("", valid.data));
    expect_load_error(dir, "binary_header", join_text(std::string("\0\xff\xfe\x01", 4), valid.data));
  }
  SECTION("header JSON not an object") {
    expect_load_error(dir, "array_header", join_text("[1, 2, 3]", valid.data), {"object"});
    expect_load_error(dir, "number_header", join_text("42", valid.data));
    expect_load_error(dir, "string_header", join_text("\"model\"", valid.data));
    expect_load_error(dir, "null_header", join_text("null", valid.data));
  }
  SECTION("deeply nested header") {
    // A hostile header must not blow the stack of a recursive parser or destructor.
    const int depth = 100000;
    expect_load_error(dir, "nested_header",
                      join_text(std::string(depth, '[') + std::string(depth, ']'), valid.data));
  }
  SECTION("parse_safetensors names what it was given") {
    REQUIRE_THROWS_WITH(vitlens::parse_safetensors("abc", "bytes from the clipboard"),
                        Contains("bytes from the clipboard"));
  }
}

TEST_CASE("malformed tensor entries give an error naming the file and the tensor", "[safetensors]") {
  TempDir dir;
  const std::string tensor = "blocks.0.norm1.weight";  // (8) F32: 32 bytes

  SECTION("entry missing dtype, shape or data_offsets") {
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      INFO("without " << field);
      expect_load_error(dir, std::string("no_") + field,
                        with_header_edit([&](json& h) { h[tensor].erase(field); }), {tensor, field});
    }
  }
  SECTION("entry not an object, fields of the wrong type") {
    expect_load_error(dir, "entry_number", with_header_edit([&](json& h) { h[tensor] = 5; }), {tensor});
    expect_load_error(dir, "dtype_number", with_header_edit([&](json& h) { h[tensor]["dtype"] = 32; }),
                      {tensor});
    expect_load_error(dir, "shape_string", with_header_edit([&](json& h) { h[tensor]["shape"] = "8"; }),
                      {tensor});
    expect_load_error(dir, "shape_entry_string",
                      with_header_edit([&](json& h) { h[tensor]["shape"] = json::array({"8"}); }), {tensor});
    expect_load_error(dir, "shape_entry_float",
                      with_header_edit([&](json& h) { h[tensor]["shape"] = json::array({8.5}); }), {tensor});
    expect_load_error(dir, "offsets_strings", with_header_edit([&](json& h) {
                        h[tensor]["data_offsets"] = json::array({"0", "32"});
                      }),
                      {tensor});
  }
  SECTION("unknown dtype") {
    for (const char* dtype : {"Q4_K", "I8", "F8_E4M3", ""}) {
      INFO("dtype '" << dtype << "'");
      expect_load_error(dir, std::string("dtype_") + dtype,
                        with_header_edit([&](json& h) { h[tensor]["dtype"] = dtype; }), {tensor, dtype});
    }
  }
  SECTION("data_offsets out of range") {
    const std::string past_end = with_header_edit([&](json& h) {
      const auto begin = h[tensor]["data_offsets"][0].get<uint64_t>();
      h[tensor]["data_offsets"] = json::array({begin + 1000000, begin + 1000032});
    });
    expect_load_error(dir, "offsets_past_end", past_end, {tensor});
    // The last tensor ends exactly at the end of the data; cut the file short by one byte.
    const std::string bytes = valid_bytes();
    expect_load_error(dir, "truncated", bytes.substr(0, bytes.size() - 1), {"pos_embed"});
    for (const json& offsets :
         {json::array({32, 0}), json::array({-32, 0}), json::array({0}), json::array({0, 32, 64}),
          json::array({0.0, 32.0}), json::array({0, 1e30}), json::array({0, "18446744073709551615"})}) {
      INFO("data_offsets " << offsets.dump());
      expect_load_error(dir, "offsets_bad",
                        with_header_edit([&](json& h) { h[tensor]["data_offsets"] = offsets; }), {tensor});
    }
    // Unsigned 2^64 - 32 as begin: must not wrap into a small or negative number.
    const std::string wrapping = with_header_edit([&](json& h) {
      h[tensor]["data_offsets"] = json::array({~uint64_t{0} - 31, ~uint64_t{0}});
    });
    expect_load_error(dir, "offsets_wrap", wrapping, {tensor});
  }
  SECTION("overlapping data_offsets") {
    const std::string other = "blocks.0.norm1.bias";  // also (8) F32
    const std::string overlapping = with_header_edit([&](json& h) {
      const auto begin = h[tensor]["data_offsets"][0].get<uint64_t>();
      h[other]["data_offsets"] = json::array({begin + 4, begin + 36});
    });
    CHECK_THAT(expect_load_error(dir, "overlap", overlapping), Contains(tensor) || Contains(other));
    const std::string aliased =
        with_header_edit([&](json& h) { h[other]["data_offsets"] = h[tensor]["data_offsets"]; });
    CHECK_THAT(expect_load_error(dir, "alias", aliased), Contains(tensor) || Contains(other));
  }
  SECTION("data_offsets size not matching dtype and shape") {
    expect_load_error(dir, "shape_too_big",
                      with_header_edit([&](json& h) { h[tensor]["shape"] = json::array({9}); }), {tensor});
    expect_load_error(dir, "shape_scalar",
                      with_header_edit([&](json& h) { h[tensor]["shape"] = json::array(); }), {tensor});
    // Same 32 bytes read as F16 would be 16 values, not 8.
    expect_load_error(dir, "dtype_f16_size", with_header_edit([&](json& h) { h[tensor]["dtype"] = "F16"; }),
                      {tensor});
  }
  SECTION("negative or absurd shape") {
    expect_load_error(dir, "shape_negative",
                      with_header_edit([&](json& h) { h[tensor]["shape"] = json::array({-8}); }), {tensor});
    // Two negatives multiply to the right element count: still wrong.
    expect_load_error(dir, "shape_two_negative", with_header_edit([&](json& h) {
                        h[tensor]["shape"] = json::array({-2, -4});
                      }),
                      {tensor});
    // 3 * 768614336404564651 * 8 = 2^64 + 8: an element count that wraps in 64 bits to exactly the
    // 8 values the 32 bytes hold. Must be rejected, not read as 8.
    expect_load_error(dir, "shape_overflow", with_header_edit([&](json& h) {
                        h[tensor]["shape"] = json::array({3, 768614336404564651LL, 8});
                      }),
                      {tensor});
  }
}

TEST_CASE("bad or missing config gives an error naming the file and the key", "[safetensors]") {
  TempDir dir;

  SECTION("no __metadata__, or no config in it") {
    expect_load_error(dir, "no_metadata", with_header_edit([](json& h) { h.erase("__metadata__"); }),
                      {"config"});
    expect_load_error(dir, "no_config", with_header_edit([](json& h) {
                        h["__metadata__"].erase("config");
                        h["__metadata__"]["format"] = "pt";
                      }),
                      {"config"});
    expect_load_error(dir, "metadata_not_object",
                      with_header_edit([](json& h) { h["__metadata__"] = "config"; }), {"__metadata__"});
    // safetensors metadata values are strings; a nested object is malformed, not a config.
    expect_load_error(dir, "config_object", with_header_edit([](json& h) {
                        h["__metadata__"]["config"] =
                            json::parse(h["__metadata__"]["config"].get<std::string>());
                      }),
                      {"config"});
  }
  SECTION("config not JSON, or not an object") {
    expect_load_error(dir, "config_not_json",
                      with_header_edit([](json& h) { h["__metadata__"]["config"] = "{\"patch_size\": 2,"; }),
                      {"config"});
    expect_load_error(dir, "config_array",
                      with_header_edit([](json& h) { h["__metadata__"]["config"] = "[2, 8]"; }), {"config"});
  }
  SECTION("config missing a key") {
    for (const char* key : {"patch_size", "embed_dim", "num_heads", "depth", "img_size", "class_token",
                            "mlp_ratio", "norm_eps", "mean", "std", "qkv_bias", "name", "description"}) {
      INFO("without " << key);
      expect_load_error(dir, std::string("config_no_") + key,
                        with_config_edit([&](json& j) { j.erase(key); }), {std::string("'") + key + "'"});
    }
  }
  SECTION("config key of the wrong type") {
    const std::vector<std::pair<const char*, json>> cases = {
        {"patch_size", "2"},
        {"embed_dim", 8.5},
        {"class_token", 1},
        {"qkv_bias", "true"},
        {"mlp_ratio", "2"},
        {"mean", json::array({0.5, 0.5})},
        {"std", json::array({0.5, 0.5, "0.5"})},
        {"img_size", json::array({4})},
        {"img_size", "4x4"},
        {"name", 7},
    };
    for (const auto& entry : cases) {
      // Named copies, not structured bindings: C++17 lambdas cannot capture those.
      const char* key = entry.first;
      const json& value = entry.second;
      INFO(key << " = " << value.dump());
      expect_load_error(dir, std::string("config_type_") + key,
                        with_config_edit([&](json& j) { j[key] = value; }), {key});
    }
  }
  SECTION("embed_dim not divisible by num_heads") {
    expect_load_error(dir, "config_indivisible", with_config_edit([](json& j) { j["num_heads"] = 3; }),
                      {"embed_dim", "num_heads"});
  }
  SECTION("values the forward pass cannot take") {
    const std::vector<std::pair<const char*, json>> cases = {
        {"patch_size", 0},
        {"patch_size", -2},
        {"num_heads", 0},
        {"embed_dim", 0},
        {"depth", 0},
        {"depth", -1},
        {"mlp_ratio", 0.0},
        {"mlp_ratio", -1.0},
        {"norm_eps", 0.0},
        {"std", json::array({0.5, 0.0, 0.5})},
        {"img_size", json::array({1, 4})},
        {"img_size", json::array({4, 5})},
        {"embed_dim", 4294967304LL},
        // 2^32 + 4 rows: taken modulo 2^32 this would pass as 4.
        {"img_size", json::array({4294967300LL, 4})},
    };
    for (const auto& entry : cases) {
      // Named copies, not structured bindings: C++17 lambdas cannot capture those.
      const char* key = entry.first;
      const json& value = entry.second;
      INFO(key << " = " << value.dump());
      expect_load_error(dir, std::string("config_value_") + key,
                        with_config_edit([&](json& j) { j[key] = value; }), {key});
    }
  }
}

TEST_CASE("missing or misshapen tensors give an error naming the file and the tensor", "[safetensors]") {
  TempDir dir;

  SECTION("a missing tensor") {
    for (const char* name : {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight",
                             "blocks.0.attn.qkv.bias", "blocks.0.mlp.fc2.bias", "norm.bias"}) {
      INFO("without " << name);
      expect_load_error(dir, std::string("missing_") + name,
                        with_tensor_edit([&](vitlens::TensorMap& t) { t.erase(name); }), {name});
    }
  }
  SECTION("a tensor with the wrong shape") {
    const std::vector<std::pair<const char*, std::vector<int64_t>>> cases = {
        {"blocks.0.attn.qkv.weight", {24, 7}},  // (3D, D - 1)
        {"blocks.0.attn.qkv.weight", {8, 24}},  // transposed
        {"pos_embed", {1, 4, 8}},               // class token row missing
        {"cls_token", {1, 8}},
        {"patch_embed.proj.weight", {8, 2, 2, 3}},  // channels last
        {"blocks.0.mlp.fc1.weight", {32, 8}},       // mlp_ratio 4, config says 2
    };
    for (const auto& entry : cases) {
      const char* name = entry.first;
      const std::vector<int64_t>& shape = entry.second;
      INFO(name);
      expect_load_error(
          dir, std::string("shape_") + name,
          with_tensor_edit([&](vitlens::TensorMap& t) { t[name] = tensor_of_shape(shape, 0.1f); }), {name});
    }
  }
  SECTION("tensors the config does not allow, and non-finite weights") {
    // qkv bias present although the config says qkv_bias false.
    const vitlens::VitConfig config = [] {
      vitlens::VitConfig c = tiny_config();
      c.qkv_bias = false;
      return c;
    }();
    vitlens::TensorMap with_bias = tiny_tensors(tiny_config());
    expect_load_error(dir, "unexpected_bias", model_bytes(vitlens::config_to_json(config), with_bias),
                      {"blocks.0.attn.qkv.bias"});
    expect_load_error(dir, "head_without_bias", with_tensor_edit([](vitlens::TensorMap& t) {
                        t["head.weight"] = tensor_of_shape({10, 8}, 0.0f);
                      }),
                      {"head"});
    expect_load_error(dir, "nan_weight", with_tensor_edit([](vitlens::TensorMap& t) {
                        t["norm.weight"].values[3] = std::nanf("");
                      }),
                      {"norm.weight"});
  }
}

TEST_CASE("F16 and BF16 tensors load as the exact float values", "[safetensors]") {
  TempDir dir;
  // Bit patterns and the values they stand for (IEEE 754 binary16; bfloat16 = top half of binary32).
  const std::vector<uint16_t> f16_bits = {0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0001, 0x03FF, 0x8000, 0x0400};
  const std::vector<float> f16_values = {1.0f,
                                         -2.0f,
                                         0.333251953125f,
                                         65504.0f,
                                         std::ldexp(1.0f, -24),            // smallest subnormal
                                         1023.0f * std::ldexp(1.0f, -24),  // largest subnormal
                                         -0.0f,
                                         std::ldexp(1.0f, -14)};  // smallest normal
  const std::vector<uint16_t> bf16_bits = {0x3F80, 0xC040, 0x3EAB, 0x7F7F, 0x0001, 0x4049, 0x8000, 0xBF00};
  const std::vector<float> bf16_values = {
      1.0f,      -3.0f, 0.333984375f, 3.3895313892515355e38f, std::ldexp(1.0f, -133),  // float32 subnormal
      3.140625f, -0.0f, -0.5f};

  // The valid tiny model, with norm.weight stored as F16 and norm.bias as BF16 (8 values each);
  // the data is re-laid out tensor by tensor so the offsets stay contiguous.
  const RawFile valid = split(valid_bytes());
  RawFile raw{json::object(), std::string()};
  for (const auto& [name, entry] : valid.header.items()) {
    if (name == "__metadata__") {
      raw.header[name] = entry;
      continue;
    }
    std::string bytes;
    std::string dtype = "F32";
    const std::vector<uint16_t>* halves = name == "norm.weight" ? &f16_bits
                                          : name == "norm.bias" ? &bf16_bits
                                                                : nullptr;
    if (halves) {
      dtype = name == "norm.weight" ? "F16" : "BF16";
      for (uint16_t h : *halves) {
        bytes += static_cast<char>(h & 0xFF);
        bytes += static_cast<char>(h >> 8);
      }
    } else {
      const auto begin = entry["data_offsets"][0].get<size_t>();
      const auto end = entry["data_offsets"][1].get<size_t>();
      bytes = valid.data.substr(begin, end - begin);
    }
    raw.header[name] = {{"dtype", dtype},
                        {"shape", entry["shape"]},
                        {"data_offsets", {raw.data.size(), raw.data.size() + bytes.size()}}};
    raw.data += bytes;
  }
  const std::string bytes = join(raw);

  const auto same_float = [](float got, float want) {
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &got, 4);
    std::memcpy(&b, &want, 4);
    return a == b;  // bit for bit: -0.0 is not 0.0
  };

  const vitlens::SafetensorsFile file = vitlens::parse_safetensors(bytes, "half precision");
  const vitlens::TensorData& f16 = file.tensors.at("norm.weight");
  const vitlens::TensorData& bf16 = file.tensors.at("norm.bias");
  CHECK(f16.source_dtype == "F16");
  CHECK(bf16.source_dtype == "BF16");
  REQUIRE(f16.values.size() == 8);
  REQUIRE(bf16.values.size() == 8);
  for (size_t i = 0; i < 8; ++i) {
    INFO("value " << i << ": F16 0x" << std::hex << f16_bits[i] << ", BF16 0x" << bf16_bits[i] << std::dec);
    CHECK(same_float(f16.values[i], f16_values[i]));
    CHECK(same_float(bf16.values[i], bf16_values[i]));
  }

  // And through load_model: the weight views see the converted values.
  const std::string path = dir.file("half.safetensors");
  write_bytes(path, bytes);
  const vitlens::VitModel model = vitlens::load_model(path);
  for (size_t i = 0; i < 8; ++i) {
    INFO("value " << i);
    CHECK(same_float(model.w.norm_w[i], f16_values[i]));
    CHECK(same_float(model.w.norm_b[i], bf16_values[i]));
  }
}

TEST_CASE("a file is read tensor by tensor into the same values as its bytes parsed whole", "[safetensors]") {
  TempDir dir;
  // One tensor of each dtype vitlens reads, one of no elements, and metadata: read_safetensors
  // reads each tensor's bytes from the file on its own; parse_safetensors converts them in memory.
  const auto bytes_of = [](const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); };
  const std::vector<float> f32 = {1.5f, -0.0f, 3.0e38f, std::ldexp(1.0f, -140), -7.25f};
  // Doubles beyond float's range round as IEEE 754 converts them (C++ leaves the result to the
  // implementation; x86-64 rounds): to +-inf from the midpoint between the largest float and
  // 2^128 up, to the largest float below it.
  const double largest = std::numeric_limits<float>::max();
  const std::vector<double> f64 = {0.1, -1e300, 2.5, largest + std::ldexp(1.0, 102), -(largest + std::ldexp(1.0, 103)),
                                   std::numeric_limits<double>::infinity()};
  const std::vector<uint16_t> f16 = {0x3C00, 0x8001, 0x7BFF}, bf16 = {0x3F80, 0xC040, 0x0001, 0x7F7F};
  const std::vector<std::pair<std::string, std::string>> data = {
      {"a", bytes_of(f32.data(), f32.size() * 4)}, {"b", ""}, {"c", bytes_of(f64.data(), f64.size() * 8)},
      {"d", bytes_of(f16.data(), f16.size() * 2)}, {"e", bytes_of(bf16.data(), bf16.size() * 2)}};
  const std::map<std::string, std::pair<std::string, json>> kinds = {
      {"a", {"F32", {5}}}, {"b", {"F32", {0, 3}}}, {"c", {"F64", {3, 2}}}, {"d", {"F16", {3}}}, {"e", {"BF16", {2, 2}}}};
  RawFile raw{json::object(), std::string()};
  raw.header["__metadata__"] = {{"note", "read in parts"}};
  for (const auto& [name, bytes] : data) {
    raw.header[name] = {{"dtype", kinds.at(name).first}, {"shape", kinds.at(name).second},
                        {"data_offsets", {raw.data.size(), raw.data.size() + bytes.size()}}};
    raw.data += bytes;
  }
  const std::string bytes = join(raw);
  const std::string path = dir.file("parts.safetensors");
  write_bytes(path, bytes);
  const vitlens::SafetensorsFile whole = vitlens::parse_safetensors(bytes, path);
  const vitlens::SafetensorsFile parts = vitlens::read_safetensors(path);
  CHECK(parts.metadata == whole.metadata);
  REQUIRE(parts.tensors.size() == 5);
  REQUIRE(whole.tensors.size() == 5);
  for (const auto& [name, tensor] : whole.tensors) {
    INFO("tensor " << name);
    const vitlens::TensorData& got = parts.tensors.at(name);
    CHECK(got.source_dtype == tensor.source_dtype);
    CHECK(got.shape == tensor.shape);
    REQUIRE(got.values.size() == tensor.values.size());
    // Bit for bit (memcmp: -0.0 is not 0.0); an empty tensor's data() may be null, which memcmp may not take.
    if (!got.values.empty()) CHECK(std::memcmp(got.values.data(), tensor.values.data(), got.values.size() * 4) == 0);
  }
  CHECK(parts.tensors.at("a").values.size() == 5);
  CHECK(std::memcmp(parts.tensors.at("a").values.data(), f32.data(), 20) == 0);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(parts.tensors.at("c").values ==
        std::vector<float>{0.1f, -inf, 2.5f, std::numeric_limits<float>::max(), -inf, inf});
  CHECK(parts.tensors.at("b").values.empty());
  // A file cut inside the last tensor is refused by its header, naming the file.
  write_bytes(path, bytes.substr(0, bytes.size() - 1));
  REQUIRE_THROWS_WITH(vitlens::read_safetensors(path), Contains(path) && Contains("'e'"));
}

TEST_CASE("a model's config alone is read from its header, with the same checks as the whole file", "[safetensors]") {
  TempDir dir;
  const std::string bytes = valid_bytes();
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, bytes);
  CHECK(vitlens::read_safetensors_metadata(path) == vitlens::read_safetensors(path).metadata);
  CHECK(vitlens::read_model_config(path).name == vitlens::load_model(path).config.name);
  // A pipe is refused from its type, without waiting for a writer; a folder and a short file too.
  const std::string fifo = dir.file("pipe.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE_THROWS_WITH(vitlens::read_model_config(fifo), Contains(fifo) && Contains("pipe"));
  const std::string folder = dir.file("folder.safetensors");
  fs::create_directories(folder);
  REQUIRE_THROWS_WITH(vitlens::read_model_config(folder), Contains(folder) && Contains("folder"));
  const std::string short_file = dir.file("short.safetensors");
  write_bytes(short_file, bytes.substr(0, 5));
  REQUIRE_THROWS_WITH(vitlens::read_model_config(short_file), Contains(short_file) && Contains("shorter than"));
}

TEST_CASE("the header is exactly its JSON, padded with spaces only: a wrong header length is refused",
          "[safetensors][format]") {
  TempDir dir;
  const std::string bytes = valid_bytes();
  const uint64_t n = read_le64(bytes);
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);

  // Space padding is the format's own: more of it still loads.
  write_bytes(dir.file("spaces.safetensors"), le64(n + 16) + header + std::string(16, ' ') + data);
  CHECK(vitlens::load_model(dir.file("spaces.safetensors")).config.embed_dim == 8);

  // Four NUL bytes after the JSON counted in the header length: the data then starts in the
  // right place, but the file is not what the format allows.
  CHECK_THAT(expect_load_error(dir, "nul_padding", le64(n + 4) + header + std::string(4, '\0') + data),
             Contains("only spaces"));
  // The header length 4 too large, the data as it was: every tensor would be read 4 bytes off.
  expect_load_error(dir, "length_plus_4", le64(n + 4) + header + data + std::string(4, '\0'));
  // The length 4 too small cuts the JSON.
  expect_load_error(dir, "length_minus_4", le64(n - 4) + header + data);
  for (const std::string& pad : {std::string("\n"), std::string("\t"), std::string("\r\n"), std::string("x")}) {
    INFO("padding " << json(pad).dump());
    expect_load_error(dir, "other_padding", le64(n + pad.size()) + header + pad + data);
  }
  // A NUL inside the header, with more JSON-looking text after it.
  std::string with_nul = header;
  with_nul.insert(with_nul.find('}') + 1, std::string("\0}", 2));
  expect_load_error(dir, "nul_inside", join_text(with_nul, data));
  // The header must begin with '{' (no leading whitespace either).
  expect_load_error(dir, "leading_space", join_text(" " + split(bytes).header.dump(), data), {"'{'"});
}

TEST_CASE("a key given twice anywhere in a model's JSON is refused, never the last one kept", "[safetensors][format]") {
  TempDir dir;
  const RawFile valid = split(valid_bytes());
  const std::string text = valid.header.dump();
  const std::string tensor = "blocks.0.norm1.weight";

  // The same tensor twice, the second pointing at another tensor's bytes (same shape and dtype).
  json second = valid.header[tensor];
  second["data_offsets"] = valid.header["blocks.0.norm1.bias"]["data_offsets"];
  const std::string twice = "{\"" + tensor + "\":" + second.dump() + "," + text.substr(1);
  CHECK_THAT(expect_load_error(dir, "tensor_twice", join_text(twice, valid.data), {tensor}), Contains("twice"));

  // A field twice in one entry.
  const std::string entry = valid.header[tensor].dump();
  std::string field_twice = text;
  field_twice.replace(field_twice.find(entry), entry.size(),
                      "{\"dtype\":\"F16\"," + entry.substr(1));
  expect_load_error(dir, "field_twice", join_text(field_twice, valid.data), {tensor, "dtype"});

  // __metadata__ twice, and a key twice inside it.
  const std::string meta = valid.header["__metadata__"].dump();
  expect_load_error(dir, "metadata_twice",
                    join_text("{\"__metadata__\":{\"format\":\"pt\"}," + text.substr(1), valid.data), {"__metadata__"});
  std::string meta_key_twice = text;
  meta_key_twice.replace(meta_key_twice.find(meta), meta.size(), "{\"config\":\"{}\"," + meta.substr(1));
  expect_load_error(dir, "metadata_key_twice", join_text(meta_key_twice, valid.data), {"config", "twice"});

  // A key twice in the config JSON: num_heads 2 then 4 (both consistent with embed_dim 8).
  const std::string config_text = vitlens::config_to_json(tiny_config()).dump();
  const std::string config_twice = "{\"num_heads\":4," + config_text.substr(1);
  expect_load_error(dir, "config_key_twice",
                    with_header_edit([&](json& h) { h["__metadata__"]["config"] = config_twice; }), {"num_heads"});
  // And a config nested 100000 deep is refused as it is read, not built.
  const std::string nested = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_load_error(dir, "config_nested",
                    with_header_edit([&](json& h) { h["__metadata__"]["config"] = nested; }), {"config", "nested"});
}

TEST_CASE("tensors are packed back to back to the end of the file, entries have the format's fields only",
          "[safetensors][format]") {
  TempDir dir;
  const RawFile valid = split(valid_bytes());
  // Bytes after the last tensor.
  expect_load_error(dir, "trailing_data", join(RawFile{valid.header, valid.data + std::string(4, '\0')}));
  // A gap: the first tensor (by offset) moved 4 bytes on, into 4 more bytes of data.
  std::string first;
  for (const auto& [name, entry] : valid.header.items())
    if (name != "__metadata__" && entry["data_offsets"][0] == 0) first = name;
  REQUIRE(!first.empty());
  RawFile gap = valid;
  for (auto& [name, entry] : gap.header.items())
    if (name != "__metadata__")
      entry["data_offsets"] = {entry["data_offsets"][0].get<uint64_t>() + 4, entry["data_offsets"][1].get<uint64_t>() + 4};
  gap.data = std::string(4, '\0') + gap.data;
  expect_load_error(dir, "gap", join(gap), {first});
  // An unknown field, and more than two offsets.
  const std::string tensor = "norm.bias";
  expect_load_error(dir, "unknown_field", with_header_edit([&](json& h) { h[tensor]["offsets"] = {0, 32}; }),
                    {tensor, "offsets"});
  expect_load_error(dir, "rank_17", with_header_edit([&](json& h) { h[tensor]["shape"] = json(std::vector<int>(17, 1)); }),
                    {tensor});
}

TEST_CASE("a header above the format's 100 MB limit is refused before it is read", "[safetensors][format]") {
  TempDir dir;
  const RawFile valid = split(valid_bytes());
  // Only the length says 100 MB + 1: refused on the length, whatever follows.
  CHECK_THAT(expect_load_error(dir, "header_too_large", le64(vitlens::kMaxSafetensorsHeaderBytes + 1) + valid.header.dump()),
             Contains("100000000"));
}

TEST_CASE("a --heads that contradicts a vitlens model file is an error, the same count is accepted", "[safetensors][heads]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, valid_bytes());
  vitlens::LoadOptions options;
  options.heads = 4;  // the file says 2
  REQUIRE_THROWS_WITH(vitlens::load_model(path, options), Contains(path) && Contains("--heads 4") && Contains("2 heads"));
  options.heads = 2;
  CHECK(vitlens::load_model(path, options).config.num_heads == 2);
}

TEST_CASE("names and descriptions read from a model are capped as they are read", "[safetensors][text]") {
  TempDir dir;
  const std::string big(3 << 20, 'n');
  std::string utf8;  // 2-byte characters: the cut must not split one
  while (utf8.size() < 5000) utf8 += "\xc3\xa9";
  const std::string path = dir.file("long_texts.safetensors");
  write_bytes(path, with_config_edit([&](json& j) {
                j["name"] = big;
                j["description"] = utf8;
                j["head_descriptions"] = json::array({json::array({big, "short"})});
              }));
  const vitlens::VitModel model = vitlens::load_model(path);
  const vitlens::VitConfig& c = model.config;
  CHECK(c.name.size() <= vitlens::kMaxModelNameBytes);
  CHECK(c.name.substr(c.name.size() - 3) == "...");
  CHECK(c.description.size() <= vitlens::kMaxModelDescriptionBytes);
  CHECK(c.description.substr(0, c.description.size() - 3).size() % 2 == 0);  // whole characters
  CHECK(c.head_descriptions[0][0].size() <= vitlens::kMaxHeadDescriptionBytes);
  CHECK(c.head_descriptions[0][1] == "short");

  // Anything else that makes a config (train --name) cannot make one longer: save refuses it.
  vitlens::VitConfig named = tiny_config();
  named.name = std::string(vitlens::kMaxModelNameBytes + 1, 'n');
  REQUIRE_THROWS_WITH(vitlens::save_model(dir.file("named.safetensors"), named, tiny_tensors(named)), Contains("name"));
}
