#include "akv/model/llama2c.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "akv/core/checked.h"
#include "akv/core/errors.h"

namespace akv {
namespace {

class Reader {
 public:
  Reader(const std::vector<float>& data) : data_(data) {}
  RowMatrix matrix(std::size_t rows, std::size_t cols) {
    RowMatrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    std::memcpy(m.data(), data_.data() + off_, rows * cols * sizeof(float));
    off_ += rows * cols;
    return m;
  }
  std::vector<float> vector(std::size_t n) {
    std::vector<float> v(data_.begin() + static_cast<std::ptrdiff_t>(off_),
                         data_.begin() + static_cast<std::ptrdiff_t>(off_ + n));
    off_ += n;
    return v;
  }
  void skip(std::size_t n) { off_ += n; }

 private:
  const std::vector<float>& data_;
  std::size_t off_ = 0;
};

}  // namespace

Model load_llama2c(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw IoError("model file not found", {path});
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open model file", {path});
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
  ModelConfig c;
  c.name = std::filesystem::path(path).stem().string();
  c.dim = static_cast<std::size_t>(h[0]);
  c.hidden_dim = static_cast<std::size_t>(h[1]);
  c.n_layers = static_cast<std::size_t>(h[2]);
  c.n_heads = static_cast<std::size_t>(h[3]);
  c.n_kv_heads = static_cast<std::size_t>(h[4]);
  const bool tied = h[5] > 0;
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
  std::uint64_t floats = 0;
  for (const std::uint64_t term :
       {checked_product({c.vocab_size, d}, where), checked_product({2, L, d}, where),
        checked_product({2, L, d, d}, where), checked_product({2, L, kv_dim, d}, where),
        checked_product({3, L, d, hid}, where), static_cast<std::uint64_t>(d),
        checked_product({c.seq_len, c.head_dim}, where),
        tied ? std::uint64_t{0} : checked_product({c.vocab_size, d}, where)}) {
    floats = checked_add(floats, term, where);
  }
  const std::uint64_t want = checked_add(28, checked_mul(4, floats, where), where);
  if (file_bytes != want) {
    throw CorruptData("file size does not match the llama2.c header (expected " + std::to_string(want) +
                          " bytes)",
                      {path, "file size", std::to_string(file_bytes)});
  }
  std::vector<float> data(floats);
  if (!in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(floats * 4))) {
    throw IoError("cannot read the weights", {path});
  }
  Reader r(data);
  ModelWeights w;
  w.embedding = r.matrix(c.vocab_size, d);
  w.layers.resize(L);
  for (auto& l : w.layers) l.attn_norm = r.vector(d);
  for (auto& l : w.layers) l.wq = r.matrix(d, d);
  for (auto& l : w.layers) l.wk = r.matrix(kv_dim, d);
  for (auto& l : w.layers) l.wv = r.matrix(kv_dim, d);
  for (auto& l : w.layers) l.wo = r.matrix(d, d);
  for (auto& l : w.layers) l.ffn_norm = r.vector(d);
  for (auto& l : w.layers) l.w1 = r.matrix(hid, d);
  for (auto& l : w.layers) l.w2 = r.matrix(d, hid);
  for (auto& l : w.layers) l.w3 = r.matrix(hid, d);
  w.final_norm = r.vector(d);
  r.skip(c.seq_len * c.head_dim);  // freq_cis_real, freq_cis_imag (unused)
  if (!tied) w.classifier = r.matrix(c.vocab_size, d);
  if (const std::size_t i = first_nonfinite(data.data(), data.size()); i < data.size()) {
    throw CorruptData("non-finite weight", {path, "weights", std::to_string(data[i])});
  }
  return Model(std::move(c), std::move(w));
}

}  // namespace akv
