#include "akv/model/llama2c.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "akv/core/checked.h"
#include "akv/core/errors.h"

namespace akv {
namespace {

// The header's model and the checkpoint's f32 count after it, checked against the file's size;
// `in` is left at the first weight.
struct Header {
  ModelConfig config;
  bool tied = true;
  std::uint64_t floats = 0;
};

Header read_header(std::ifstream& in, const std::string& path) {
  std::error_code ec;
  const std::uint64_t file_bytes = std::filesystem::file_size(path, ec);
  std::int32_t h[7];
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) {
    throw CorruptData("file shorter than the llama2.c header (28 bytes)", {path, "header",
                                                                          std::to_string(file_bytes)});
  }
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    if (h[i] == 0 || (i != 5 && h[i] < 0) || std::abs(static_cast<long long>(h[i])) > (1 << 24)) {
      throw InvalidInput("impossible llama2.c header value", {path, names[i], std::to_string(h[i])});
    }
  }
  Header r;
  ModelConfig& c = r.config;
  c.name = std::filesystem::path(path).stem().string();
  c.dim = static_cast<std::size_t>(h[0]);
  c.hidden_dim = static_cast<std::size_t>(h[1]);
  c.n_layers = static_cast<std::size_t>(h[2]);
  c.n_heads = static_cast<std::size_t>(h[3]);
  c.n_kv_heads = static_cast<std::size_t>(h[4]);
  r.tied = h[5] > 0;
  c.vocab_size = static_cast<std::size_t>(std::abs(h[5]));
  c.seq_len = static_cast<std::size_t>(h[6]);
  c.rope_layout = RopeLayout::interleaved;
  c.rope_theta = 10000.0;
  c.norm_eps = 1e-5f;
  if (c.dim % c.n_heads != 0 || (c.dim / c.n_heads) % 2 != 0) {
    throw InvalidInput("dim must be a multiple of n_heads with an even head size", {path, "dim", std::to_string(c.dim)});
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw InvalidInput("n_heads must be a multiple of n_kv_heads", {path, "n_kv_heads", std::to_string(c.n_kv_heads)});
  }
  c.head_dim = c.dim / c.n_heads;
  const std::size_t kv_dim = c.n_kv_heads * c.head_dim, L = c.n_layers, d = c.dim, hid = c.hidden_dim;
  // Header values go up to 2^24 each: their products can pass 2^64, so every term is checked.
  const Where where{path, "header sizes"};
  for (const std::uint64_t term :
       {checked_product({c.vocab_size, d}, where), checked_product({2, L, d}, where),
        checked_product({2, L, d, d}, where), checked_product({2, L, kv_dim, d}, where),
        checked_product({3, L, d, hid}, where), static_cast<std::uint64_t>(d),
        checked_product({c.seq_len, c.head_dim}, where),
        r.tied ? std::uint64_t{0} : checked_product({c.vocab_size, d}, where)}) {
    r.floats = checked_add(r.floats, term, where);
  }
  const std::uint64_t want = checked_add(28, checked_mul(4, r.floats, where), where);
  if (file_bytes != want) {
    throw CorruptData("file size does not match the llama2.c header (expected " + std::to_string(want) +
                          " bytes)",
                      {path, "file size", std::to_string(file_bytes)});
  }
  return r;
}

std::ifstream open_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw IoError("model file not found", {path});
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open model file", {path});
  return in;
}

// Reads the weights in file order straight into their tensors (no copy of the whole file),
// each tensor checked for non-finite values as it is read.
class Reader {
 public:
  Reader(std::ifstream& in, const std::string& path) : in_(in), path_(path) {}
  RowMatrix matrix(std::size_t rows, std::size_t cols, const char* what) {
    RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    read(m.data(), rows * cols, what);
    return m;
  }
  std::vector<float> vector(std::size_t n, const char* what) {
    std::vector<float> v(n);
    read(v.data(), n, what);
    return v;
  }
  void skip(std::size_t n) { in_.seekg(static_cast<std::streamoff>(4 * n), std::ios::cur); }

 private:
  void read(float* dst, std::size_t n, const char* what) {
    if (!in_.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(4 * n))) {
      throw IoError("cannot read the weights", {path_, what});
    }
    if (const std::size_t i = first_nonfinite(dst, n); i < n) {
      throw CorruptData("non-finite weight", {path_, what, std::to_string(dst[i])});
    }
  }
  std::ifstream& in_;
  const std::string& path_;
};

}  // namespace

bool is_llama2c_path(const std::string& path) {
  std::error_code ec;
  return std::filesystem::path(path).extension() == ".bin" && std::filesystem::is_regular_file(path, ec);
}

Llama2cShape read_llama2c_shape(const std::string& path) {
  std::ifstream in = open_checkpoint(path);
  const Header h = read_header(in, path);
  return {h.config, 4 * (h.floats - h.config.seq_len * h.config.head_dim)};
}

Model load_llama2c(const std::string& path) {
  std::ifstream in = open_checkpoint(path);
  Header h = read_header(in, path);
  ModelConfig& c = h.config;
  const std::size_t kv_dim = c.n_kv_heads * c.head_dim, d = c.dim, hid = c.hidden_dim;
  Reader r(in, path);
  ModelWeights w;
  w.embedding = r.matrix(c.vocab_size, d, "token_embedding");
  w.layers.resize(c.n_layers);
  for (auto& l : w.layers) l.attn_norm = r.vector(d, "rms_att_weight");
  for (auto& l : w.layers) l.wq = r.matrix(d, d, "wq");
  for (auto& l : w.layers) l.wk = r.matrix(kv_dim, d, "wk");
  for (auto& l : w.layers) l.wv = r.matrix(kv_dim, d, "wv");
  for (auto& l : w.layers) l.wo = r.matrix(d, d, "wo");
  for (auto& l : w.layers) l.ffn_norm = r.vector(d, "rms_ffn_weight");
  for (auto& l : w.layers) l.w1 = r.matrix(hid, d, "w1");
  for (auto& l : w.layers) l.w2 = r.matrix(d, hid, "w2");
  for (auto& l : w.layers) l.w3 = r.matrix(hid, d, "w3");
  w.final_norm = r.vector(d, "rms_final_weight");
  r.skip(c.seq_len * c.head_dim);  // freq_cis_real, freq_cis_imag (unused)
  if (!h.tied) w.classifier = r.matrix(c.vocab_size, d, "wcls");
  return Model(std::move(c), std::move(w));
}

}  // namespace akv
