#pragma once
// akv dump format v1 (HDF5): K/V/query tensors of one model run. Documented in docs/formats.md.
//
//   root attributes: format = "akv-dump", version = 1, model, n_layers, n_heads, n_kv_heads,
//                    head_dim, rope_theta, rope_layout ("interleaved" | "rotate-half"), n_tokens
//   /layers/<L>/key           [n_kv_heads, n_tokens, head_dim]  f16|bf16|f32|f64, after RoPE
//   /layers/<L>/value         [n_kv_heads, n_tokens, head_dim]
//   /layers/<L>/query         [n_heads, n_query, head_dim]   queries of the last n_query
//                                                              positions, after RoPE
//   /layers/<L>/key_pre_rope  [n_kv_heads, n_tokens, head_dim] (optional)
//   /layers/<L>/key_fisher, value_fisher  [n_kv_heads, n_tokens, head_dim] (optional, both in
//                             every layer or unused): per-element sensitivity weights of the
//                             pre-RoPE keys and the values (KVQuant: Fisher information, the
//                             squared gradient of the loss), finite and >= 0; written by users
//                             (h5py), read by akv calibrate's nuq codebook fit
//   /layers/<L>/head_kind     [n_kv_heads] strings (optional; synth writes local|retrieval|diffuse)
//   /layers/<L>/o_proj        [hidden, n_heads * head_dim] (optional, in every layer or none): the
//                             attention output projection (Hugging Face's o_proj.weight), for CriticalKV
//   /layers/<L>/attn_input    [n_tokens, hidden] (optional, in every layer or none): each token's
//                             attention input, the RMS-normed hidden state (what Hugging Face's
//                             self_attn receives), for KVzap
//   /layers/<L>/kvzip_plus    [n_kv_heads, n_tokens] (optional, in every layer or none): each
//                             token's KVzip+ score (score/kvzip.h), finite and > 0, for fitting KVzap
//   /tokens                   [n_tokens] integer token ids (optional)
//   /needles                  [n_needles] integer token positions (optional)
//
// The reader validates the whole structure when it opens a file (metadata only) and reads
// tensor data a layer or a head at a time, checking every value is finite.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "akv/core/progress.h"
#include "akv/io/hdf5.h"
#include "akv/tensor/dtype.h"
#include "akv/tensor/kv_shape.h"
#include "akv/tensor/tensor.h"

namespace akv {

inline constexpr const char* kDumpFormat = "akv-dump";
inline constexpr std::int64_t kDumpVersion = 1;

// The model's KV shape, the sequence length and the observation window of a dump (n_query:
// queries of the last n_query positions), and the model's name.
struct DumpMeta : KvWindow {
  std::string model;
};

// Root attributes describing the model and sequence shape (model, n_layers, n_heads,
// n_kv_heads, head_dim, rope_theta, rope_layout, n_tokens), shared by dumps and caches.
// The reader validates them and throws InvalidInput naming the attribute.
void read_shape_attrs(hid_t root, const std::string& file, DumpMeta& meta);
void write_shape_attrs(hid_t root, const DumpMeta& meta);

// A dump of a model with sliding-window layers records each local layer's window
// (/layers/L.sliding_window; KvShape::layer_window). Where a window holds fewer positions than the
// dump's tokens, that layer's queries see only their window, which the offline commands do not
// model: `what` (compression, calibration, ...) is refused, InvalidInput naming the file, the
// layer's attribute and its window. A dump no longer than every window reads as global layers.
void require_windows_hold_tokens(const DumpMeta& meta, const std::string& file, const std::string& what);

enum class DumpField { key, value, query, key_pre_rope, key_fisher, value_fisher };
// "key", "value", "query", "key_pre_rope", "key_fisher", "value_fisher"
std::string dump_field_name(DumpField f);

struct DumpDatasetInfo {
  bool present = false;
  h5::DiskFloat dtype = h5::DiskFloat::f32;
  std::uint64_t storage_bytes = 0;
};

// The optional 2-D datasets of a layer: o_proj, attn_input, kvzip_plus.
enum class DumpMatrix { out_proj, attn_input, kvzip_plus };
std::string dump_matrix_path(std::size_t layer, DumpMatrix m);

struct DumpLayerInfo {
  DumpDatasetInfo key, value, query, key_pre_rope, key_fisher, value_fisher;
  DumpDatasetInfo out_proj, attn_input, kvzip_plus;  // the DumpMatrix datasets
  std::size_t matrix_rows[3] = {0, 0, 0}, matrix_cols[3] = {0, 0, 0};  // [DumpMatrix]: their shapes
  std::size_t hidden = 0;    // o_proj's rows
  std::vector<std::string> head_kinds;  // [n_kv_heads] or empty
  const DumpDatasetInfo& field(DumpField f) const;
  DumpDatasetInfo& matrix(DumpMatrix m);
  const DumpDatasetInfo& matrix(DumpMatrix m) const;
};

// Path of a dataset inside a dump, e.g. "/layers/3/key".
std::string dump_dataset_path(std::size_t layer, DumpField f);

class DumpReader {
 public:
  // Opens and validates `path`; throws IoError / CorruptData / InvalidInput naming the field.
  explicit DumpReader(std::string path);

  const std::string& path() const { return path_; }
  const DumpMeta& meta() const { return meta_; }
  const DumpLayerInfo& layer(std::size_t l) const { return layers_.at(l); }
  bool has_key_pre_rope() const;  // present in every layer
  bool has_fisher() const;        // key_fisher and value_fisher present in every layer
  bool has_out_proj() const;      // /layers/L/o_proj present (the reader checks: in every layer or none)
  bool has_matrix(DumpMatrix m) const;  // present (in every layer: the reader checks)
  std::size_t input_dim() const;  // attn_input's columns (0 without it)
  const std::optional<std::vector<std::int32_t>>& tokens() const { return tokens_; }
  const std::optional<std::vector<std::int32_t>>& needles() const { return needles_; }
  std::uint64_t file_bytes() const { return file_bytes_; }

  // Reads heads [head_begin, head_begin + head_count) of one dataset as f32:
  // key/value/key_pre_rope -> [head_count, n_tokens, head_dim],
  // query -> [head_count, n_query, head_dim]. head_count 0 = to the last head.
  // Throws InvalidInput naming layer, head and token of the first NaN or Inf.
  Tensor3 read(std::size_t layer, DumpField f, std::size_t head_begin = 0,
               std::size_t head_count = 0) const;
  // The same into `out`, reusing its storage (layer loops keep one tensor per field).
  void read_into(Tensor3& out, std::size_t layer, DumpField f, std::size_t head_begin = 0,
                 std::size_t head_count = 0) const;
  // One layer's /layers/L/o_proj as f32 [hidden, n_heads * head_dim]; InvalidInput naming the
  // element of the first NaN or Inf, or the dataset when the dump has none.
  RowMatrix read_out_proj(std::size_t layer) const;
  // Any of the 2-D datasets as f32 [rows, cols], with the same checks.
  RowMatrix read_matrix(std::size_t layer, DumpMatrix m) const;

 private:
  mutable std::vector<std::uint16_t> raw_;  // one head of an f16/bf16 dataset as stored, reused by every read
  void read_meta();
  void read_layer_info(std::size_t l);
  // Layer l's 3-D dataset `field` checked (rank 3, d0 along axis 0, d1 along axis 1 unless 0,
  // head_dim along axis 2, a float type, stored bytes) and described in `out`; its axis 1.
  std::size_t check_tensor(std::size_t l, DumpField field, DumpDatasetInfo& out, std::size_t d0, const char* d0_name,
                           const char* d0_meta, std::size_t d1, const char* d1_name) const;
  // Layer l's optional 2-D dataset `which`: in every layer or none, float, rows x cols (0: any,
  // the same in every layer; `expect` says the shape in errors), described in info.
  void check_matrix(std::size_t l, DumpMatrix which, DumpLayerInfo& info, std::size_t rows, std::size_t cols,
                    const std::string& expect) const;
  void read_optional_vectors();

  std::string path_;
  h5::File file_;
  DumpMeta meta_;
  std::vector<DumpLayerInfo> layers_;
  std::optional<std::vector<std::int32_t>> tokens_;
  std::optional<std::vector<std::int32_t>> needles_;
  std::uint64_t file_bytes_ = 0;
};

struct DumpWriteOptions {
  DType dtype = DType::f16;    // storage type of key/value/query/key_pre_rope
  int gzip = 0;                // 0 = none, 1..9 = deflate level (with byte shuffle)
  bool key_pre_rope = false;   // create /layers/L/key_pre_rope
  bool head_kinds = false;     // create /layers/L/head_kind
  std::size_t out_proj_hidden = 0;  // > 0: create /layers/L/o_proj [hidden, n_heads * head_dim]
  std::size_t input_dim = 0;        // > 0: create /layers/L/attn_input [n_tokens, input_dim]
  bool kvzip_plus = false;          // create /layers/L/kvzip_plus [n_kv_heads, n_tokens] (f32)
};

// Writes a dump to a temporary file next to `path`; the file appears at `path` only when
// commit() succeeds after every head of every dataset has been written.
class DumpWriter {
 public:
  DumpWriter(std::string path, DumpMeta meta, DumpWriteOptions options);
  ~DumpWriter();
  DumpWriter(const DumpWriter&) = delete;
  DumpWriter& operator=(const DumpWriter&) = delete;

  // Writes block [heads, rows, head_dim] into heads [head_begin, head_begin + heads).
  void write(std::size_t layer, DumpField f, std::size_t head_begin, const Tensor3& block);
  void write_head_kinds(std::size_t layer, const std::vector<std::string>& kinds);
  // One layer's output projection [out_proj_hidden, n_heads * head_dim], in the dump's dtype.
  void write_out_proj(std::size_t layer, const RowMatrix& wo);
  // One layer's attention inputs [n_tokens, input_dim], in the dump's dtype.
  void write_attn_input(std::size_t layer, const RowMatrix& x);
  // One layer's KVzip+ scores [n_kv_heads][n_tokens], stored as f32 whatever the dtype.
  void write_kvzip_plus(std::size_t layer, const std::vector<std::vector<double>>& scores);
  void write_tokens(const std::vector<std::int32_t>& tokens);
  void write_needles(const std::vector<std::int32_t>& positions);
  void write_root_attr(const std::string& name, const std::string& value);
  void write_root_attr(const std::string& name, std::int64_t value);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace akv
