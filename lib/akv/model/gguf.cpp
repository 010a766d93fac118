#include "akv/model/gguf.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/model/architecture.h"
#include "akv/tensor/ggml_blocks.h"

namespace akv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr int kMaxArrayDepth = 3;
constexpr std::size_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr std::uint64_t kMaxArray = 1u << 24;  // metadata array values (vocabularies hold ~2^18)

enum ValueType : std::uint32_t { u8, i8, u16, i16, u32, i32, f32, boolean, string, array, u64, i64, f64 };

// The fewest bytes a value of this type occupies (bounds counts before anything is allocated).
std::uint64_t min_bytes(std::uint32_t t) {
  switch (t) {
    case u8: case i8: case boolean: return 1;
    case u16: case i16: return 2;
    case u32: case i32: case f32: return 4;
    case u64: case i64: case f64: case string: return 8;
    case array: return 12;
    default: return 0;
  }
}

// Sequential reads that never pass the end of the file.
class Cursor {
 public:
  explicit Cursor(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    std::error_code ec;
    size_ = fs::file_size(path, ec);
    if (ec || !in_) throw IoError("cannot read GGUF file", {path});
  }
  std::uint64_t pos() const { return pos_; }
  void seek(std::uint64_t pos) {
    if (pos > size_ || !in_.seekg(static_cast<std::streamoff>(pos))) throw IoError("cannot seek", {path_, "offset", std::to_string(pos)});
    pos_ = pos;
  }
  void skip(std::uint64_t n, const std::string& what) {
    if (n > remaining()) throw CorruptData("file ends inside " + what, {path_, what, "offset " + std::to_string(pos_)});
    seek(pos_ + n);
  }
  std::uint64_t size() const { return size_; }
  std::uint64_t remaining() const { return size_ - pos_; }
  void read(void* dst, std::uint64_t n, const std::string& what) {
    if (n > remaining()) {
      throw CorruptData("file ends inside " + what, {path_, what, "offset " + std::to_string(pos_)});
    }
    if (!in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) throw IoError("cannot read", {path_, what});
    pos_ += n;
  }
  template <class T>
  T get(const std::string& what) {
    T v{};
    read(&v, sizeof v, what);
    return v;
  }
  std::string str(const std::string& what) {
    const auto n = get<std::uint64_t>(what);
    if (n > remaining()) throw CorruptData("string length beyond the file", {path_, what, std::to_string(n)});
    std::string s(n, '\0');
    read(s.data(), n, what);
    return s;
  }
  void skip_str(const std::string& what) {
    const auto n = get<std::uint64_t>(what);
    if (n > remaining()) throw CorruptData("string length beyond the file", {path_, what, std::to_string(n)});
    skip(n, what);
  }
  // Checks that `count` values of at least `each` bytes fit in what is left.
  void check_count(std::uint64_t count, std::uint64_t each, const std::string& what) const {
    if (each > 0 && count > remaining() / each) {
      throw CorruptData("count beyond the file", {path_, what, std::to_string(count)});
    }
  }

 private:
  std::string path_;
  std::ifstream in_;
  std::uint64_t size_ = 0, pos_ = 0;
};

// An array's element type and length, checked against what is left of the file.
GgufArray array_header(Cursor& c, const std::string& key, int depth, const std::string& path) {
  if (depth >= kMaxArrayDepth) throw CorruptData("arrays nested too deeply", {path, key, std::to_string(depth + 1)});
  GgufArray a;
  a.type = c.get<std::uint32_t>(key + " (array type)");
  if (min_bytes(a.type) == 0) throw CorruptData("unknown metadata value type", {path, key, std::to_string(a.type)});
  a.count = c.get<std::uint64_t>(key + " (array length)");
  c.check_count(a.count, min_bytes(a.type), key);
  if (a.count > kMaxArray) {
    throw InvalidInput("metadata array longer than akv reads (2^24 values)", {path, key, std::to_string(a.count)});
  }
  a.offset = c.pos();
  return a;
}

// Moves past an array's values (header read) without keeping them.
void skip_array(Cursor& c, const GgufArray& a, const std::string& key, int depth, const std::string& path) {
  if (a.type == string) {
    for (std::uint64_t i = 0; i < a.count; ++i) c.skip_str(key);
  } else if (a.type == array) {
    for (std::uint64_t i = 0; i < a.count; ++i) skip_array(c, array_header(c, key, depth + 1, path), key, depth + 1, path);
  } else {
    c.skip(a.count * min_bytes(a.type), key);  // fixed-size values: check_count bounded the product by the file
  }
}

// A scalar value (arrays are skipped on open and read by the typed readers).
json read_value(Cursor& c, std::uint32_t type, const std::string& key, const std::string& path) {
  switch (type) {
    case u8: return c.get<std::uint8_t>(key);
    case i8: return c.get<std::int8_t>(key);
    case u16: return c.get<std::uint16_t>(key);
    case i16: return c.get<std::int16_t>(key);
    case u32: return c.get<std::uint32_t>(key);
    case i32: return c.get<std::int32_t>(key);
    case f32: return c.get<float>(key);
    case boolean: {
      const auto b = c.get<std::uint8_t>(key);
      if (b > 1) throw CorruptData("boolean must be 0 or 1", {path, key, std::to_string(b)});
      return b == 1;
    }
    case string: return c.str(key);
    case u64: return c.get<std::uint64_t>(key);
    case i64: return c.get<std::int64_t>(key);
    case f64: return c.get<double>(key);
    default:
      throw CorruptData("unknown metadata value type", {path, key, std::to_string(type)});
  }
}

std::string dims_text(const std::vector<std::uint64_t>& d) {
  std::string o = "[";
  for (std::size_t i = 0; i < d.size(); ++i) o += (i ? ", " : "") + std::to_string(d[i]);
  return o + "]";
}

}  // namespace

nlohmann::json gguf_info(const GgufFile& f) {
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : f.metadata().items()) meta[k] = v;
  for (const auto& [k, a] : f.arrays()) meta[k] = "[" + std::to_string(a.count) + " values]";
  nlohmann::json types = nlohmann::json::object();
  std::uint64_t total = 0;
  for (const auto& [name, t] : f.tensors()) {
    nlohmann::json& e = types[ggml_type_name(t.type)];
    if (e.is_null()) e = {{"tensors", 0}, {"bytes", 0}};
    e["tensors"] = e["tensors"].get<std::size_t>() + 1;
    e["bytes"] = e["bytes"].get<std::uint64_t>() + t.bytes;
    total += t.bytes;
  }
  const auto text = [&](const char* key) {
    const auto it = f.metadata().find(key);
    return it != f.metadata().end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  return {{"format", "gguf"}, {"version", f.version()}, {"file", f.path()}, {"architecture", text("general.architecture")},
          {"name", text("general.name")}, {"tokenizer", text("tokenizer.ggml.model")}, {"tensors", f.tensors().size()},
          {"tensor_bytes", total}, {"types", types}, {"metadata", meta}};
}

std::string render_gguf_info(const nlohmann::json& info) {
  std::string out;
  auto line = [&](const std::string& k, const std::string& v) { out += k + std::string(k.size() < 13 ? 13 - k.size() : 1, ' ') + v + "\n"; };
  line("file", info["file"].get<std::string>());
  line("format", "GGUF v" + std::to_string(info["version"].get<int>()));
  line("architecture", info["architecture"].get<std::string>());
  line("name", info["name"].get<std::string>());
  line("tokenizer", info["tokenizer"].get<std::string>().empty() ? "none" : info["tokenizer"].get<std::string>());
  line("tensors", std::to_string(info["tensors"].get<std::size_t>()) + " (" +
                      std::to_string(info["tensor_bytes"].get<std::uint64_t>()) + " bytes)");
  for (const auto& [type, e] : info["types"].items()) {
    line("  " + type, std::to_string(e["tensors"].get<std::size_t>()) + " tensors, " +
                          std::to_string(e["bytes"].get<std::uint64_t>()) + " bytes" +
                          (ggml_type_info_by_name(type) ? "" : " (not readable by akv)"));
  }
  out += "metadata\n";
  for (const auto& [k, v] : info["metadata"].items()) line("  " + k, v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

std::optional<nlohmann::json> GgufFile::value(const std::string& key) const {
  if (arrays_.count(key)) throw InvalidInput("metadata value is a list where one value is expected", {path_, key});
  if (const auto it = meta_.find(key); it != meta_.end()) return *it;
  return std::nullopt;
}

namespace {

bool is_integer(std::uint32_t t) { return t == u8 || t == i8 || t == u16 || t == i16 || t == u32 || t == i32 || t == u64 || t == i64; }
bool is_number(std::uint32_t t) { return is_integer(t) || t == f32 || t == f64; }
bool is_string(std::uint32_t t) { return t == string; }

// One value of a numeric type as Out (int64: integers exactly, u64 past 2^63 saturated).
template <typename Out>
Out number_at(Cursor& c, std::uint32_t type, const std::string& key) {
  switch (type) {
    case u8: return static_cast<Out>(c.get<std::uint8_t>(key));
    case i8: return static_cast<Out>(c.get<std::int8_t>(key));
    case u16: return static_cast<Out>(c.get<std::uint16_t>(key));
    case i16: return static_cast<Out>(c.get<std::int16_t>(key));
    case u32: return static_cast<Out>(c.get<std::uint32_t>(key));
    case i32: return static_cast<Out>(c.get<std::int32_t>(key));
    case u64: {
      const auto v = c.get<std::uint64_t>(key);
      return static_cast<Out>(std::min<std::uint64_t>(v, std::numeric_limits<std::int64_t>::max()));
    }
    case i64: return static_cast<Out>(c.get<std::int64_t>(key));
    case f32: return static_cast<Out>(c.get<float>(key));
    default: return static_cast<Out>(c.get<double>(key));
  }
}

}  // namespace

const GgufArray* GgufFile::array_of(const std::string& key, bool (*accept)(std::uint32_t), const char* kind) const {
  if (meta_.contains(key)) throw InvalidInput(std::string("metadata value is one value where a list of ") + kind + " is expected", {path_, key});
  const auto a = arrays_.find(key);
  if (a == arrays_.end()) return nullptr;
  if (!accept(a->second.type)) {
    throw InvalidInput(std::string("metadata list of another kind (expected ") + kind + ")",
                       {path_, key, "value type " + std::to_string(a->second.type)});
  }
  return &a->second;
}

std::optional<std::vector<std::string>> GgufFile::strings(const std::string& key) const {
  const GgufArray* a = array_of(key, is_string, "strings");
  if (!a) return std::nullopt;
  Cursor c(path_);
  c.seek(a->offset);
  std::vector<std::string> out;
  out.reserve(a->count);
  for (std::uint64_t i = 0; i < a->count; ++i) out.push_back(c.str(key));
  return out;
}

std::optional<std::vector<float>> GgufFile::floats(const std::string& key) const {
  const GgufArray* a = array_of(key, is_number, "numbers");
  if (!a) return std::nullopt;
  Cursor c(path_);
  c.seek(a->offset);
  std::vector<float> out(a->count);
  for (float& x : out) x = number_at<float>(c, a->type, key);
  return out;
}

std::optional<std::vector<std::int32_t>> GgufFile::int32s(const std::string& key) const {
  const GgufArray* a = array_of(key, is_integer, "integers");
  if (!a) return std::nullopt;
  Cursor c(path_);
  c.seek(a->offset);
  std::vector<std::int32_t> out(a->count);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto v = number_at<std::int64_t>(c, a->type, key);
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max()) {
      throw InvalidInput("list value outside int32", {path_, key + "[" + std::to_string(i) + "]", std::to_string(v)});
    }
    out[i] = static_cast<std::int32_t>(v);
  }
  return out;
}

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4];
  return in.read(m, 4) && std::memcmp(m, kMagic, 4) == 0;
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  Cursor c(path);
  file_size_ = c.size();
  char magic[4];
  c.read(magic, 4, "header");
  if (std::memcmp(magic, kMagic, 4) != 0) throw CorruptData("not a GGUF file (no GGUF magic)", {path, "header"});
  version_ = c.get<std::uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    throw InvalidInput("unsupported GGUF version (akv reads 2 and 3)", {path, "version", std::to_string(version_)});
  }
  const auto n_tensors = c.get<std::uint64_t>("tensor_count");
  const auto n_kv = c.get<std::uint64_t>("metadata_kv_count");
  c.check_count(n_kv, 8 + 4 + 1, "metadata_kv_count");
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str("metadata key " + std::to_string(i));
    const auto type = c.get<std::uint32_t>(key + " (type)");
    if (meta_.contains(key) || arrays_.count(key)) throw CorruptData("metadata key stored twice", {path, key});
    if (type == array) {  // skipped now, read by value() when asked for
      const GgufArray a = array_header(c, key, 0, path);
      skip_array(c, a, key, 0, path);
      arrays_.emplace(key, a);
    } else {
      meta_[key] = read_value(c, type, key, path);
    }
  }
  std::uint64_t alignment = 32;
  if (meta_.contains("general.alignment")) {
    const json& a = meta_["general.alignment"];
    if (!a.is_number_unsigned() || a.get<std::uint64_t>() == 0 || a.get<std::uint64_t>() > (1u << 20) ||
        (a.get<std::uint64_t>() & (a.get<std::uint64_t>() - 1)) != 0) {
      throw CorruptData("alignment must be a power of two up to 2^20", {path, "general.alignment", a.dump()});
    }
    alignment = a.get<std::uint64_t>();
  }
  c.check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor_count");
  std::vector<GgufTensor> infos;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.str("tensor " + std::to_string(i) + " name");
    const auto n_dims = c.get<std::uint32_t>(t.name + " (n_dims)");
    if (n_dims == 0 || n_dims > kMaxDims) {
      throw CorruptData("tensor must have 1 to 4 dimensions", {path, t.name + ".n_dims", std::to_string(n_dims)});
    }
    for (std::uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(c.get<std::uint64_t>(t.name + " (dims)"));
    t.type = c.get<std::uint32_t>(t.name + " (type)");
    t.offset = c.get<std::uint64_t>(t.name + " (offset)");
    infos.push_back(std::move(t));
  }
  data_start_ = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start_ > file_size_) throw CorruptData("file ends before the tensor data", {path, "data", std::to_string(file_size_)});
  const std::uint64_t data_size = file_size_ - data_start_;
  for (GgufTensor& t : infos) {
    const Where where{path, t.name + ".dims", dims_text(t.dims)};
    std::uint64_t numel = 1;
    for (std::uint64_t d : t.dims) {
      if (d == 0) throw CorruptData("tensor dimension 0", where);
      numel = checked_mul(numel, d, where);
    }
    if (t.offset % alignment != 0) {
      throw CorruptData("tensor offset not aligned to " + std::to_string(alignment), {path, t.name + ".offset", std::to_string(t.offset)});
    }
    if (const GgmlTypeInfo* info = ggml_type_info(t.type)) {
      if (t.dims[0] % info->block != 0) {
        throw CorruptData(std::string("row length not a multiple of the ") + info->name + " block (" +
                              std::to_string(info->block) + ")", where);
      }
      t.bytes = checked_mul(numel / info->block, info->bytes, where);
      if (t.offset > data_size || t.bytes > data_size - t.offset) {
        throw CorruptData("tensor data beyond the file (data section holds " + std::to_string(data_size) + " bytes)",
                          {path, t.name + ".offset", std::to_string(t.offset) + " + " + std::to_string(t.bytes)});
      }
    }
    const std::string name = t.name;
    if (!tensors_.emplace(name, std::move(t)).second) throw CorruptData("tensor stored twice", {path, name});
  }
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void GgufFile::check(const GgufTensor& t, const std::vector<std::uint64_t>& dims) const {
  if (t.dims != dims) {
    throw InvalidInput("tensor shape does not match the metadata (expected " + dims_text(dims) + ")",
                       {path_, t.name + ".dims", dims_text(t.dims)});
  }
  if (!ggml_type_info(t.type)) {
    throw InvalidInput("unsupported tensor type (akv reads " + ggml_supported_types() + ")",
                       {path_, t.name + ".type", ggml_type_name(t.type)});
  }
}

std::vector<float> GgufFile::read(const std::string& name, const std::vector<std::uint64_t>& dims) const {
  const GgufTensor* t = find(name);
  if (!t) throw InvalidInput("missing tensor", {path_, name});
  check(*t, dims);
  const GgmlTypeInfo* info = ggml_type_info(t->type);
  std::vector<std::uint8_t> raw(t->bytes);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + t->offset));
  if (!in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()))) {
    throw IoError("cannot read tensor", {path_, name});
  }
  std::uint64_t numel = 1;
  for (std::uint64_t d : dims) numel *= d;
  std::vector<float> out(numel);
  ggml_dequantize(*info, raw.data(), out.size(), out.data());
  if (const std::size_t i = first_nonfinite(out.data(), out.size()); i < out.size()) {
    throw CorruptData("non-finite weight", {path_, name + "[" + std::to_string(i) + "]", format_number(out[i])});
  }
  return out;
}

namespace {

class Meta {
 public:
  Meta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const json* get(const std::string& key) const {
    const json& m = f_.metadata();
    const auto it = m.find(key);
    return it == m.end() ? nullptr : &*it;
  }
  // {arch}.suffix as a positive integer; `fallback` when absent (none = required).
  std::size_t count(const std::string& suffix, std::optional<std::size_t> fallback = std::nullopt) const {
    const std::string key = arch_ + "." + suffix;
    const json* v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      throw InvalidInput("metadata missing", {f_.path(), key});
    }
    if (!v->is_number_integer() || v->get<std::int64_t>() <= 0 || v->get<std::uint64_t>() > (1ull << 32)) {
      throw InvalidInput("metadata must be a positive integer", {f_.path(), key, v->dump()});
    }
    return v->get<std::size_t>();
  }
  double real(const std::string& suffix, double fallback) const {
    const std::string key = arch_ + "." + suffix;
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0) {
      throw InvalidInput("metadata must be a positive number", {f_.path(), key, v->is_number() ? format_number(v->get<double>()) : v->dump()});
    }
    return v->get<double>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) throw InvalidInput("metadata must be a string", {f_.path(), key, v->dump()});
    return v->get<std::string>();
  }

 private:
  const GgufFile& f_;
  std::string arch_;
};

// A matrix [rows, cols]: (modes stored and q8) its bytes in a memory map of the file, as stored;
// or (mode f32, or a misaligned F32 tensor) an f32 copy. With `total` > 0: rows [row0, row0 +
// rows) of a tensor of `total` rows (phi3's fused attn_qkv and ffn_up).
Weight matrix(const GgufFile& f, const std::string& name, std::size_t rows, std::size_t cols, WeightMode mode,
              std::shared_ptr<MappedFile>& mapped, std::size_t row0 = 0, std::size_t total = 0) {
  if (total == 0) total = rows;
  const GgufTensor* t = f.find(name);
  // F32 tensors are used in place too (no copy, pages read on first use) when 4-byte aligned,
  // as the GGUF data alignment (32 by default) makes them.
  const bool in_place = t && ggml_type_info(t->type) && (t->type != 0 || (f.data_start() + t->offset) % 4 == 0);
  if (mode != WeightMode::f32 && in_place) {
    f.check(*t, {cols, total});
    if (!mapped) mapped = std::make_shared<MappedFile>(f.path());
    const GgmlTypeInfo& type = *ggml_type_info(t->type);
    const std::uint8_t* data = mapped->data() + f.data_start() + t->offset + row0 * (cols / type.block * type.bytes);
    if (const std::size_t bad = ggml_first_nonfinite(type, data, rows * cols); bad < rows * cols) {
      throw CorruptData("non-finite weight", {f.path(), name + "[" + std::to_string(row0 * cols + bad) + "]"});
    }
    return Weight::encoded(rows, cols, type, data, mapped, mode == WeightMode::q8);
  }
  const std::vector<float> v = f.read(name, {cols, total});
  RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  std::memcpy(m.data(), v.data() + row0 * cols, rows * cols * sizeof(float));
  return m;
}

// Gemma 2 and 3 as llama.cpp reads them (src/models/gemma2.cpp, gemma3.cpp):
// attention.sliding_window (Gemma 3: absent means every layer global; Gemma 2: default 4096),
// attention.sliding_window_pattern (a per-layer bool array, or P: layer i local when i % P < P - 1;
// default 6, Gemma 2: 2), Gemma 3's rope.freq_base_swa (default 10000) for the local layers, which
// rotate without the scaling (Gemma 2's rotate as the global ones); the queries scaled by
// 1 / sqrt(n_embd / n_head) on the 27B models (Gemma 3: 62 layers, Gemma 2: 46) and
// 1 / sqrt(head_dim) otherwise (llama.cpp's rule: the file carries no query_pre_attn_scalar);
// Gemma 2's attn_logit_softcapping and final_logit_softcapping (defaults 50 and 30), Gemma 3's
// final_logit_softcapping when set; GeGLU, embeddings times sqrt(n_embd). The converter stored the
// norms as 1 + w.
void gemma_config(const GgufFile& f, const Meta& m, const std::string& arch, ModelConfig& c) {
  const bool gemma2 = arch == "gemma2";
  if (gemma2 || m.get(arch + ".attention.sliding_window")) {
    const std::size_t window = m.count("attention.sliding_window", 4096);
    std::vector<bool> local(c.n_layers);
    const json* pattern = m.get(arch + ".attention.sliding_window_pattern");
    if (pattern && pattern->is_array()) {
      if (pattern->size() != c.n_layers) {
        throw InvalidInput("sliding_window_pattern must hold one flag per layer",
                           {f.path(), arch + ".attention.sliding_window_pattern", std::to_string(pattern->size())});
      }
      for (std::size_t l = 0; l < c.n_layers; ++l) local[l] = (*pattern)[l].is_boolean() && (*pattern)[l].get<bool>();
    } else {
      const std::size_t p = pattern ? m.count("attention.sliding_window_pattern") : gemma2 ? 2 : 6;
      for (std::size_t l = 0; l < c.n_layers; ++l) local[l] = l % p < p - 1;
    }
    for (std::size_t l = 0; l < c.n_layers; ++l) c.layer_window.push_back(local[l] ? window : 0);
    if (!gemma2) c.rope_theta_local = m.real("rope.freq_base_swa", 10000.0);
  }
  const bool is_27b = c.n_layers == (gemma2 ? 46 : 62);
  const float scale = is_27b ? 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads))
                             : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (scale != 1.0f / std::sqrt(static_cast<float>(c.head_dim))) c.attn_scale = scale;
  c.activation = ModelConfig::Activation::gelu_tanh;
  c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  c.final_softcap = static_cast<float>(m.real("final_logit_softcapping", gemma2 ? 30.0 : 0.0));
  if (gemma2) c.attn_softcap = static_cast<float>(m.real("attn_logit_softcapping", 50.0));
}

// Gemma 2 and Gemma 3: their own config keys (gemma_config) and post-norms.
bool gemma_arch(const std::string& arch) { return arch == "gemma3" || arch == "gemma2"; }

// RoPE scaling (none, linear, yarn; rope_freqs.weight factors; Phi-3's longrope tensors) into
// c.rope_scaling.
void gguf_rope_scaling(const GgufFile& f, const Meta& m, const std::string& path, const std::string& arch,
                       ModelConfig& c) {
  const std::string scaling = m.text(arch + ".rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::linear;
    c.rope_scaling.factor = m.real("rope.scaling.factor", 1.0);
  } else if (scaling == "yarn") {
    // llama.cpp's YaRN (ggml_rope_yarn_corr_dims, rope_yarn): the ramp between the correction
    // dims of beta_fast and beta_slow over the original context, ext_factor 1, and cos/sin scaled
    // by attn_factor (1 + 0.1 ln factor): transformers' yarn with these values.
    RopeScaling& s = c.rope_scaling;
    s.kind = RopeScaling::Kind::yarn;
    s.factor = m.real("rope.scaling.factor", 1.0);
    s.original_max_positions = m.count("rope.scaling.original_context_length");
    s.beta_fast = m.real("rope.scaling.yarn_beta_fast", 32.0);
    s.beta_slow = m.real("rope.scaling.yarn_beta_slow", 1.0);
    if (const json* ext = m.get(arch + ".rope.scaling.yarn_ext_factor");
        ext && !(ext->is_number() && (ext->get<double>() < 0 || ext->get<double>() == 1.0))) {
      throw InvalidInput("yarn_ext_factor other than 1 (or unset) is not implemented", {path, arch + ".rope.scaling.yarn_ext_factor", ext->dump()});
    }
    if (const json* mul = m.get(arch + ".rope.scaling.yarn_log_multiplier"); mul && !(mul->is_number() && mul->get<double>() == 0.0)) {
      throw InvalidInput("yarn_log_multiplier (DeepSeek mscale) is not implemented", {path, arch + ".rope.scaling.yarn_log_multiplier", mul->dump()});
    }
    s.attention_factor = m.real("rope.scaling.yarn_attn_factor", 1.0) * (1.0 + 0.1 * std::log(s.factor));
    if (s.factor < 1.0) throw InvalidInput("yarn factor below 1", {path, arch + ".rope.scaling.factor", format_number(s.factor)});
  } else if (scaling != "none") {
    throw InvalidInput("rope scaling type not implemented (akv reads none, linear, yarn, and rope_freqs.weight)",
                       {path, arch + ".rope.scaling.type", scaling});
  }
  const std::size_t rot = c.rotary_dim ? c.rotary_dim : c.head_dim;
  if (f.find("rope_freqs.weight")) c.rope_scaling.freq_factors = f.read("rope_freqs.weight", {rot / 2});
  if (f.find("rope_factors_long.weight") || f.find("rope_factors_short.weight")) {
    // Phi-3's longrope as llama.cpp's converter writes it: both factor lists, the original context
    // (default: context_length, as llama.cpp) and the attention factor that scales cos and sin.
    for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
      if (!f.find(t)) throw InvalidInput("longrope needs both factor tensors", {path, t, "missing"});
    }
    RopeScaling& s = c.rope_scaling;
    if (s.kind != RopeScaling::Kind::none || !s.freq_factors.empty()) {
      throw InvalidInput("longrope factors beside another RoPE scaling", {path, arch + ".rope.scaling.type", rope_scaling_name(s.kind)});
    }
    s.kind = RopeScaling::Kind::longrope;
    s.long_factors = f.read("rope_factors_long.weight", {rot / 2});
    s.short_factors = f.read("rope_factors_short.weight", {rot / 2});
    s.original_max_positions = m.count("rope.scaling.original_context_length", c.seq_len);
    s.factor = static_cast<double>(c.seq_len) / static_cast<double>(s.original_max_positions);
    s.attention_factor = m.real("rope.scaling.attn_factor", 1.0);
  }
}

// The model's shape, attention and RoPE from the metadata of architecture `arch` (m: its keys).
ModelConfig gguf_config(const GgufFile& f, const Meta& global, const Meta& m, const std::string& path,
                        const std::string& arch) {
  ModelConfig c;
  c.name = global.text("general.name", fs::path(path).stem().string());
  c.dim = m.count("embedding_length");
  c.n_layers = m.count("block_count");
  c.hidden_dim = m.count("feed_forward_length");
  c.n_heads = m.count("attention.head_count");
  c.n_kv_heads = m.count("attention.head_count_kv", c.n_heads);
  c.seq_len = m.count("context_length");
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    throw InvalidInput("attention.head_count must be a multiple of head_count_kv (" + std::to_string(c.n_heads) + ")",
                       {path, arch + ".attention.head_count_kv", std::to_string(c.n_kv_heads)});
  }
  c.head_dim = m.count("attention.key_length", c.dim / c.n_heads);
  if (m.count("attention.value_length", c.head_dim) != c.head_dim) {
    throw InvalidInput("value_length must equal key_length (" + std::to_string(c.head_dim) + ")",
                       {path, arch + ".attention.value_length", std::to_string(m.count("attention.value_length"))});
  }
  if (c.head_dim == 0 || c.head_dim % 2 != 0) {
    throw InvalidInput("head dimension must be even and positive", {path, arch + ".attention.key_length", std::to_string(c.head_dim)});
  }
  c.rotary_dim = m.count("rope.dimension_count", c.head_dim);
  if (c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0) {
    throw InvalidInput("rope.dimension_count must be even and at most the head dimension " + std::to_string(c.head_dim),
                       {path, arch + ".rope.dimension_count", std::to_string(c.rotary_dim)});
  }
  if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
  c.rope_theta = m.real("rope.freq_base", 10000.0);
  c.norm_eps = static_cast<float>(m.real("attention.layer_norm_rms_epsilon", 1e-5));
  // llama.cpp: LLM_ARCH_LLAMA ropes as "normal" (pairs 2i, 2i+1; its converter permutes q/k to
  // match), qwen2 as NeoX (pairs i, i + d/2).
  c.rope_layout = arch == "llama" ? RopeLayout::interleaved : RopeLayout::rotate_half;  // qwen3: NeoX too
  gguf_rope_scaling(f, m, path, arch, c);
  const GgufTensor* embd = f.find("token_embd.weight");
  if (!embd || embd->dims.size() != 2) throw InvalidInput("missing tensor (or not a matrix)", {path, "token_embd.weight"});
  c.vocab_size = embd->dims[1];
  c.qkv_bias = arch == "qwen2" || f.find("blk.0.attn_q.bias") != nullptr;
  if (gemma_arch(arch)) gemma_config(f, m, arch, c);
  return c;
}

// Layer l's weights (llama.cpp's tensor names; Phi-3's fused attn_qkv and ffn_up).
LayerWeights gguf_layer(const GgufFile& f, const ModelConfig& c, const std::string& arch, std::size_t l, WeightMode mode,
                        std::shared_ptr<MappedFile>& mapped) {
  const std::size_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const std::string p = "blk." + std::to_string(l) + ".";
  LayerWeights lw;
  lw.attn_norm = f.read(p + "attn_norm.weight", {c.dim});
  if (arch == "phi3") {  // attn_qkv: the q rows, then k, then v
    const std::size_t all = q_dim + 2 * kv_dim;
    lw.wq = matrix(f, p + "attn_qkv.weight", q_dim, c.dim, mode, mapped, 0, all);
    lw.wk = matrix(f, p + "attn_qkv.weight", kv_dim, c.dim, mode, mapped, q_dim, all);
    lw.wv = matrix(f, p + "attn_qkv.weight", kv_dim, c.dim, mode, mapped, q_dim + kv_dim, all);
  } else {
    lw.wq = matrix(f, p + "attn_q.weight", q_dim, c.dim, mode, mapped);
    lw.wk = matrix(f, p + "attn_k.weight", kv_dim, c.dim, mode, mapped);
    lw.wv = matrix(f, p + "attn_v.weight", kv_dim, c.dim, mode, mapped);
  }
  lw.wo = matrix(f, p + "attn_output.weight", c.dim, q_dim, mode, mapped);
  if (c.qkv_bias) {
    lw.bq = f.read(p + "attn_q.bias", {q_dim});
    lw.bk = f.read(p + "attn_k.bias", {kv_dim});
    lw.bv = f.read(p + "attn_v.bias", {kv_dim});
  }
  if (arch == "qwen3" || arch == "gemma3") {  // RMSNorm of each query and key head before RoPE
    lw.q_norm = f.read(p + "attn_q_norm.weight", {c.head_dim});
    lw.k_norm = f.read(p + "attn_k_norm.weight", {c.head_dim});
  }
  lw.ffn_norm = f.read(p + "ffn_norm.weight", {c.dim});
  if (gemma_arch(arch)) {  // the attention's and the MLP's outputs normalized before the residual
    lw.post_attn_norm = f.read(p + "post_attention_norm.weight", {c.dim});
    lw.post_ffn_norm = f.read(p + "post_ffw_norm.weight", {c.dim});
  }
  if (arch == "phi3") {  // ffn_up holds gate then up (llama.cpp's fused SwiGLU input)
    lw.w1 = matrix(f, p + "ffn_up.weight", c.hidden_dim, c.dim, mode, mapped, 0, 2 * c.hidden_dim);
    lw.w3 = matrix(f, p + "ffn_up.weight", c.hidden_dim, c.dim, mode, mapped, c.hidden_dim, 2 * c.hidden_dim);
  } else {
    lw.w1 = matrix(f, p + "ffn_gate.weight", c.hidden_dim, c.dim, mode, mapped);
    lw.w3 = matrix(f, p + "ffn_up.weight", c.hidden_dim, c.dim, mode, mapped);
  }
  lw.w2 = matrix(f, p + "ffn_down.weight", c.dim, c.hidden_dim, mode, mapped);
  return lw;
}

}  // namespace

Model load_gguf(const std::string& path, WeightMode mode) {
  const GgufFile f(path);
  std::shared_ptr<MappedFile> mapped;  // one map of the file for every encoded weight
  const Meta global(f, "");
  const std::string arch = global.text("general.architecture", "");
  const auto& runs = supported_gguf_architectures();
  if (std::find(runs.begin(), runs.end(), arch) == runs.end()) {
    throw InvalidInput(unsupported_architecture("architecture", arch, runs), {path, "general.architecture", arch.empty() ? "missing" : arch});
  }
  const Meta m(f, arch);
  ModelConfig c = gguf_config(f, global, m, path, arch);
  ModelWeights w;
  w.embedding = matrix(f, "token_embd.weight", c.vocab_size, c.dim, mode, mapped);
  for (std::size_t l = 0; l < c.n_layers; ++l) w.layers.push_back(gguf_layer(f, c, arch, l, mode, mapped));
  w.final_norm = f.read("output_norm.weight", {c.dim});
  if (f.find("output.weight")) w.classifier = matrix(f, "output.weight", c.vocab_size, c.dim, mode, mapped);
  return Model(std::move(c), std::move(w));
}

}  // namespace akv
