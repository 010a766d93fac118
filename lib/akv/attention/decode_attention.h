#pragma once
// Decode attention: one new query token per query head over the KV cache of its head group,
// reading packed quantized rows directly (fused dequantization, no dequantized copy of K or V).
//
// out[h] = sum_t softmax_t(scale * q[h] . k_t) v_t over the rows of KV head h / group_size.
//
// Fast path: tiles of `tile` tokens, one pass with online softmax (running max and sum per
// query head); the query heads of a KV group share each read of a key or value row. Packed
// keys quantized per channel use score_t = q.zero + (q * scale) . code_t (query folded into
// the group's parameters once per group), packed values per token accumulate
// (p_t * scale) * code_t and p_t * zero separately. AVX2/FMA vector loops when compiled for
// x86-64-v3, with generic fallbacks (a dequantized tile) for layouts the vector loops do not
// cover (head_dim or quantized channels not a multiple of 8, outlier channels on values,
// per-token keys, per-channel values, groups of values not a multiple of 8 channels).
// KVQuant's codes (nuq, 2 to 4 bits) are read the same way through their levels (kernels.h
// level formats): keys per channel score q.offset + (q * range) . levels[code], values per row
// accumulate (p_t * range_t) * levels[code] and p_t * offset_t, the sparse outliers added as
// corrections and the f16 sink rows read as such. Each value is levels[code] x range + offset
// in f32 where nuq_decode (and so the reference over dequantized rows) rounds it to f16: outputs
// agree within 1e-3 (tests/unit/test_attention.cpp). Tables whose values could overflow take a
// decoded tile.
//
// Long rows are cut into partitions of `partition` tokens (fixed, independent of the thread
// count), computed independently on threads and merged in order: results are bitwise
// identical for any thread count.
#include <cstddef>
#include <string>

#include "akv/attention/kv_view.h"

namespace akv {

// How far attention over nuq codes may be from the reference over their decoded rows (the f16
// rounding above): the kernel checks of `bench attention` and `bench policy` allow this much.
inline constexpr double kNuqAttentionTolerance = 1e-3;

// exact: f32 products and sums (the default). int8: packed 2- and 4-bit keys (per channel) and
// values (per token, groups of a multiple of 32 channels) in rows of a multiple of 32 channels
// go through the integer loops of attention/int8.h: the query folded into each key group's
// scales rounded to int8 (blocks of 32 channels, one step each), the probabilities times the
// value scales rounded to 7 bits (per 16 tokens, query head and group), exact integer sums.
// Dense rows and other layouts stay exact. Results are still bitwise identical for every
// instruction set and thread count; their error against exact is measured in docs/attention.md.
// llama: exact, but each query head whose keys are ggml blocks (F16 rows excepted) is first
// rounded to Q8_0 blocks (d = max|x| / 127 in f16, codes rounded to nearest), as llama.cpp's CPU
// attention converts the query to the key type's dot-product type (Q8_0 or Q8_1, the same
// values) before the block dot products (the batch prefill mode, eval/lanes.h).
enum class AttentionMode { exact, int8, llama };
const char* attention_mode_name(AttentionMode m);
// "exact" or "int8"; InvalidInput naming `flag` otherwise.
AttentionMode parse_attention_mode(const std::string& s, const char* flag = "--attention");

struct DecodeAttentionOptions {
  int threads = 1;
  std::size_t tile = 64;          // tokens per online-softmax step
  std::size_t partition = 4096;   // tokens per work item (multiple of tile)
  AttentionMode mode = AttentionMode::exact;
};

struct DecodeAttentionArgs {
  const float* query = nullptr;  // [n_heads, head_dim]
  std::size_t n_heads = 0, head_dim = 0;
  // [n_kv_heads * segments]: each KV head's rows as `segments` consecutive views (tiers: one
  // view per tier; empty views allowed). n_heads is a multiple of n_kv_heads.
  const HeadView* heads = nullptr;
  std::size_t n_kv_heads = 0;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
  float* out = nullptr;  // [n_heads, head_dim]
  // Optional: [n_heads] pointers, each to the KV head's row count (all segments, in segment
  // order) of floats, receiving the attention probabilities of that query head (null entries
  // are skipped).
  float* const* probs = nullptr;
  std::size_t segments = 1;
  // Optional: [n_heads], query head h attends to the first visible[h] rows of its KV head (all
  // segments, in segment order; 1 <= visible[h] <= its rows): the causal mask of several tokens'
  // queries attending together, each to the rows up to its own (Model::decode_lanes over a
  // ChunkCache). Masked rows score -infinity: a query head's output equals its call over those
  // rows alone up to the order of its sums. Not with probs (InvalidInput).
  const std::size_t* visible = nullptr;
  // Optional: [n_heads], query head h attends from row first[h] on (first[h] < its visible rows,
  // or its rows without visible): a sliding window's first key (a chunk of a local layer's
  // queries attending together). Masked the same way; not with probs.
  const std::size_t* first = nullptr;
  // Gemma 2's attention logit soft-capping: each scaled score s becomes c tanh(s / c) before the
  // softmax (0: none).
  float softcap = 0.0f;
};

// Throws InvalidInput on inconsistent shapes (names the field). A head with no rows outputs 0.
// Rotated views (TensorView::rotation; every segment of a head rotated alike): the query heads
// of a KV head are rotated by its key rotation before the loops, their outputs rotated back by
// its value rotation after them.
void decode_attention(const DecodeAttentionArgs& a, const DecodeAttentionOptions& o = {});

// Reference: dequantizes every row (dequantize_rows, rotated rows rotated back), scores and
// softmax in double, plain loops. The fast path equals it within 1e-5 relative error
// (tests/unit/test_attention.cpp).
void decode_attention_ref(const DecodeAttentionArgs& a);

}  // namespace akv
