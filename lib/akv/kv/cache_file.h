#pragma once
// akv compressed-cache format v1 (HDF5), documented in docs/formats.md.
//
//   root attributes: format = "akv-cache", version = 1, params (JSON text: method and every
//     parameter), source_path, source_hash ("xxh3-64:<hex>"), source_bytes, and the source dump's
//     shape: model, n_layers, n_heads, n_kv_heads, head_dim, rope_theta, rope_layout, n_tokens,
//     n_query
//   /layers/<L>/heads/<H>             attributes n_tokens, n_kept
//   /layers/<L>/heads/<H>/kept        int32 [n_kept] kept positions (only after eviction)
//   /layers/<L>/heads/<H>/{key,value} attributes bits, axis, group, n_quant, n_residual,
//                                     n_outlier, pre_rope; datasets (present when non-empty):
//     codes            uint8 [packed bytes]       packed codes of [n_quant, head_dim - n_outlier]
//     scale, zero      f16 [n_groups]
//     residual         f16 [n_residual, head_dim]
//     outlier_channels uint16 [n_outlier]
//     outlier_values   f16 [n_quant, n_outlier]
// Version 2 (tiered caches) adds segmented heads: a head group with attribute n_segments >= 1
// holds /segments/<S>, each laid out like a version-1 head group (n_tokens, n_kept, kept, key,
// value); the segments' kept positions partition [0, n_tokens). Files without segmented heads
// are written as version 1; the reader accepts both.
// Version 3 (method ggml, llama.cpp's cache types) stores each key/value group as ggml blocks:
// attribute ggml_type (llama.cpp's name: f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; equal to
// params.ggml.k / .v), n_quant = n_kept, n_residual = n_outlier = pre_rope = 0, and dataset
//     blocks           uint8 [n_kept * head_dim / block * block bytes]  (rows in kept order)
// Version 4 (rotate=hadamard|random, quant/rotation.h): params.rotate is set and each rotated
// key/value group carries attributes rotate (hadamard | random), rotate_block and rotate_seed;
// its codes, blocks and residual rows hold the rotated rows. Otherwise laid out as version 1, 2
// or 3 (method ggml).
// Version 6 (method nuq, KVQuant's codebooks, quant/nuq.h) stores each key/value group as nuq
// rows: n_quant = n_kept, n_residual = n_outlier = 0, pre_rope = 1 on keys; attributes bits,
// per_channel (keys 1), sparsity, sink, n_sink = the kept rows at positions below sink (the first
// ones); datasets (present when
// non-empty)
//     levels           f32 [2^bits]            the layer's levels
//     upper, lower     f16 [head_dim]          keys: each channel's thresholds
//     sink             f16 [n_sink, head_dim]  the first rows, exact
//     codes            uint8 [(n_kept - n_sink) * ceil(head_dim * bits / 8)]  a level per value
//     offset, range    f32 [n_kept - n_sink]   values: each row's
//     sparse_counts    uint16 [n_kept - n_sink]  outliers per row
//     sparse_channels  uint16 [outliers]       their channels, ascending within a row
//     sparse_values    f16 [outliers]          their values
// A partial cache (`akv compress --shard K/N`, docs/scale.md) is the same layout with format
// "akv-cache-part", root attributes shard, shards, first_layer, end_layer, and only the head
// groups of layers [first_layer, end_layer); only `akv merge` reads it.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "akv/io/dump.h"
#include "akv/kv/stored_head.h"
#include "akv/method/params.h"

namespace akv {

inline constexpr const char* kCacheFormat = "akv-cache";
inline constexpr std::int64_t kCacheVersion = 1;
inline constexpr std::int64_t kCacheVersionSegments = 2;
inline constexpr std::int64_t kCacheVersionGgml = 3;
inline constexpr std::int64_t kCacheVersionRotation = 4;
inline constexpr std::int64_t kCacheVersionFp8 = 5;
inline constexpr std::int64_t kCacheVersionNuq = 6;
inline constexpr const char* kCachePartFormat = "akv-cache-part";

// The layers a partial cache holds (shards == 1: a whole cache).
struct CachePart {
  std::size_t shard = 1, shards = 1, first_layer = 0, end_layer = 0;
  bool partial() const { return shards > 1; }
};

struct CacheHeader {
  DumpMeta meta;  // shape of the source dump
  CompressParams params;
  std::string source_path;
  std::string source_hash;
  std::uint64_t source_bytes = 0;
};

class CacheWriter {
 public:
  // Writes to a temporary file next to `path`; the cache appears only on commit(). With a
  // partial `part`, a partial cache of its layers.
  CacheWriter(std::string path, CacheHeader header, const CachePart& part = CachePart{});
  ~CacheWriter();
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;
  void write_head(std::size_t layer, std::size_t head, const HeadCache& h);
  void commit();  // throws if a head is missing

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CacheReader {
 public:
  // Opens and validates the header; throws IoError / CorruptData / InvalidInput. Partial caches
  // are refused unless `allow_part`.
  explicit CacheReader(std::string path, bool allow_part = false);
  const CachePart& part() const { return part_; }
  ~CacheReader();
  const std::string& path() const { return path_; }
  const CacheHeader& header() const { return header_; }
  const DumpMeta& meta() const { return header_.meta; }
  // Reads and validates one head (sizes, ranges, packed lengths). Throws CorruptData naming the
  // dataset when anything is inconsistent.
  HeadCache read_head(std::size_t layer, std::size_t head) const;
  // Bytes actually stored per component for one head, from the stored dataset sizes.
  CacheBytes stored_bytes(std::size_t layer, std::size_t head) const;
  std::uint64_t file_bytes() const { return file_bytes_; }
  std::int64_t version() const { return version_; }

 private:
  // The head group at path of `layer` (its ggml types: boundary layers store f16); `top`: not a
  // segment (only a top-level group may hold segments).
  HeadCache read_head_group(const std::string& path, std::size_t layer, std::size_t head, bool top) const;
  // The n_seg segments of a tiered head group into h.segments, checked to hold each of its
  // n_tokens positions once.
  void read_segments(const std::string& path, std::size_t layer, std::size_t head, std::size_t n_seg,
                     HeadCache& h) const;
  // The kept positions (n_kept, ascending, inside [0, h.n_tokens)) into h.kept.
  void read_kept(const std::string& dataset, std::size_t n_kept, HeadCache& h) const;
  // The key (`key`) or value group at part_path of a head holding n_kept rows (at `kept`), in
  // whichever layout the method stores: ggml blocks, nuq codes, or affine codes plus f16 residual.
  void read_part(const std::string& part_path, bool key, std::size_t layer, std::size_t head, std::size_t n_kept,
                 const std::vector<std::int32_t>& kept, PackedTensor& p) const;
  // n_quant rows of affine codes (bits, axis, group, scale, zero) with n_out f16 outlier channels
  // (of group `group`, the HDF5 group part_path).
  void read_affine_rows(const std::string& part_path, hid_t group, std::size_t n_quant, std::size_t n_out,
                        PackedTensor& p) const;
  // A nuq key (key) or value part of n_rows rows at the `kept` positions (empty: 0..n_rows-1),
  // version 6.
  void read_nuq_part(const std::string& part_path, bool key, std::size_t n_rows, const std::vector<std::int32_t>& kept,
                     PackedTensor& p) const;
  // A ggml key or value group of n_rows rows; rows_only: it declares no residual or outliers.
  void read_ggml_part(const std::string& part_path, const std::string& type_name, std::size_t n_rows,
                      bool rows_only, PackedTensor& p) const;
  CacheBytes stored_group_bytes(const std::string& path) const;
  std::string path_;
  std::int64_t version_ = kCacheVersion;
  h5::File file_;
  CacheHeader header_;
  CachePart part_;
  std::uint64_t file_bytes_ = 0;
};

// Path of a head's group, e.g. "/layers/3/heads/1".
std::string cache_head_path(std::size_t layer, std::size_t head);

// What reconstruct_head needs for a cache's keys: when they were quantized before RoPE, a RoPE
// table of the dump's positions [0, m.n_tokens) (m: the dump the cache was made from), none
// otherwise. Movable: context points into the table, which a move keeps.
struct CacheRope {
  std::unique_ptr<RopeTable> table;
  RopeContext context;
};
CacheRope cache_rope(const CacheReader& cache, const DumpMeta& m);

}  // namespace akv
