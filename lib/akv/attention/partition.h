#pragma once
// Decode attention's work on one partition of one KV head's rows (internal to the attention
// module). prepare_head: a head segment's state for one decode step (its query heads scaled, and
// what reading its coded rows needs: nuq levels and ranges, TurboQuant codebooks, fp8 scales,
// QJL sign tables); run_partition: the online softmax over the partition's tiles, scores by
// the key rows' loops (kernels.h), values accumulated, into a Partial that decode_attention
// merges with the head's other partitions.
#include <cstddef>
#include <optional>
#include <vector>

#include "akv/attention/decode_attention.h"
#include "akv/attention/kernels.h"
#include "akv/attention/sign_tables.h"
#include "akv/tensor/turboquant.h"

namespace akv::attn {

// A nuq tensor read by the level loops (kernels.h level formats) instead of a decoded tile: its
// levels, and per channel its offset and range (empty for a per-row table, whose rows carry
// theirs). fused only for 2 to 4 bits when every level x range + offset is finite (else
// nuq_decode's zeros would differ).
struct NuqPrep {
  bool fused = false;
  float levels[16] = {};  // attn::level_table of the codes' values
  std::vector<float> offset, range;
  std::vector<float> zero;  // per channel: the code-0 value, levels[0] x range + offset
};

// TurboQuant rows read by the vector loops instead of a decoded tile: row r is range_r x
// (levels[code_i], or code_i itself for value rows) + offset_r, where keys have range = the f16
// norm (key_nc: times 1 / sqrt(the sum of the row's squared levels + 1e-16), that sum by the
// score loops in the same pass, score_rows' sq), offset 0, and value rows the f16 scale and
// minimum (tq_fields).
// key_qjl keys: their levels so, the QJL term added to the scores (qjl_scores); 1-bit levels
// (tq2j): level = c0 + (c1 - c0) bit, so a row's sum is sum q x (c1 - c0) bit + c0 sum q, the
// first by sign tables of q x (c1 - c0) (as the QJL term's signs, HeadPrep), the second bias1.
// Not for a key_qjl value tensor: decoded.
struct TqPrep {
  std::optional<TqType> type;  // set when the rows go through the vector loops
  RowFormat format = RowFormat::f32;  // the codes' (1-bit levels: none, w1_tables reads them)
  float levels[16] = {};  // attn::level_table of the codes' values
  std::vector<float> ones;  // key_nc values: the weights of a pass that only sums squares
  std::vector<float> bias1;  // 1-bit levels: per query head c0 x sum q
  std::optional<SignTables> w1_tables;  // and the sign tables of every head's q x (c1 - c0)
};

// fp8 rows (one byte per value) read by the vector loops (kernels.h e4m3 / e5m2 formats): the
// view's scale folded into the query (keys: w = q x scale) or the probabilities (values).
struct Fp8Prep {
  RowFormat format = RowFormat::f32;  // e4m3 or e5m2 when set
  float scale = 1.0f;
  bool set() const { return format != RowFormat::f32; }
};

// Per-channel packed keys the kernels read directly (the query split into quantized and outlier
// channels, HeadPrep::q_in / q_out).
inline bool fast_packed_keys(const PackedView& p) { return p.axis == QuantAxis::channel && p.cols % 8 == 0; }

// Per KV head segment: its query heads (scaled), and for per-channel packed keys the query split
// into the quantized channels and the outlier channels.
struct HeadPrep {
  const HeadView* view = nullptr;
  std::vector<float> q;  // [nq, d], times the softmax scale (folded in once, not per score)
  std::vector<float> q_in, q_out;
  // nuq keys and values read by the level loops; keys per channel: w = q * range, bias = q .
  // offset. qsum: per query head the sum of q (times each row's offset: keys with a per-row
  // offset).
  NuqPrep nuq_key, nuq_value;
  std::vector<float> nuq_w, nuq_bias, qsum;
  TqPrep tq_key, tq_value;
  Fp8Prep fp8_key, fp8_value;
  std::vector<float> fp8_w;  // fp8 keys: q x scale
  std::optional<TqType> qjl;          // keys are TurboQuant rows with QJL signs
  std::vector<TqQjlQuery> qjl_query;  // then: per query head, its projection S q (no sign tables)
  std::optional<SignTables> qjl_signs;  // and the sign tables of every head's S q (the QJL term's sign sums)
};

// A partition's online softmax per query head: running maximum, sum of weights, unnormalised
// outputs.
struct Partial {
  std::vector<float> m, l, acc;  // [nq], [nq], [nq * d]
};

// Segment seg of KV head kv of a decode step.
HeadPrep prepare_head(const DecodeAttentionArgs& a, std::size_t kv, std::size_t seg);

// Rows [a, b) of hp's view (nq query heads, head_dim d, o's tile and mode; softcap 0: none)
// into out. raw (or null): per query head, where its raw scores go (null entries: none);
// visible and first (or null): per query head, the rows it sees ([first, visible)), counted
// from row -offset of the view (the KV head's earlier segments).
void run_partition(const HeadPrep& hp, std::size_t nq, std::size_t d, const DecodeAttentionOptions& o, float softcap,
                   std::size_t a, std::size_t b, Partial& out, float* const* raw, const std::size_t* visible,
                   std::size_t offset, const std::size_t* first);

}  // namespace akv::attn
