#pragma once
// `akv bench attention`: decode attention time per token (one new query per query head over
// one layer's KV heads) on synthetic caches: dense f32, dense f16, and packed KIVI layouts
// (per-channel keys in groups of G tokens, per-token values, an f16 residual window), next to a
// stream-read bandwidth and an f32 FMA peak measured in the same run.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "akv/attention/decode_attention.h"
#include "akv/bench/report.h"

namespace akv {

struct AttentionBenchOptions {
  std::vector<std::size_t> contexts = {1024, 4096, 16384, 65536, 131072};
  std::vector<std::size_t> head_dims = {64, 128};
  std::vector<std::size_t> gqa = {1, 4};  // query heads per KV head
  std::size_t kv_heads = 8, residual = 128, group = 32;
  // f32, f16, q<b> (keys and values at b bits), k<b>v<b> or nuq<b> (KVQuant's codes under
  // codebooks fitted on the bench's rows); b in 2, 3, 4, 8.
  std::vector<std::string> variants = {"f32", "f16", "q8", "q4", "q3", "q2"};
  // Instruction sets to time every variant with: "best" (what the CPU has), "avx512",
  // "avx2", "generic" (the scalar loops); unavailable ones are refused.
  std::vector<std::string> isas = {"best"};
  // Attention paths to time every packed variant with: "exact", "int8" (the integer loops; only
  // variants with 2- or 4-bit keys or values, the codes those loops read).
  std::vector<std::string> attention = {"exact"};
  std::size_t tile = DecodeAttentionOptions{}.tile, partition = DecodeAttentionOptions{}.partition;
  int warmup = 1, repeat = 5, threads = 0;
  double min_sample_s = 0.002;  // each sample repeats the call until it lasts this long
  std::uint64_t seed = 1;
  std::size_t stream_bytes = std::size_t{512} << 20;
  // Shard K of N (docs/scale.md): cases are (head_dim, context) pairs, head_dim-major, contexts
  // ascending; a shard times a contiguous range of them (every variant, ISA and gqa of each),
  // with its own kernel check, stream-read and FMA baselines. Unset: the whole run.
  std::optional<Shard> shard;
};

// Rows: one per (head_dim, context, gqa, variant, isa, attention); "of_stream" = effective GB/s
// over the stream figure, "of_fma" = the call's multiply-adds (query heads x tokens x head_dim x
// 2) at the FMA peak over its time; "err_vs_f32" = relative error (L2 over all heads) of the
// output against the f32 variant's (the unquantized rows; null without f32 among the variants),
// "err_vs_exact" = int8 rows' relative error against the same cache's exact path. Extra JSON: "stream_read_gbs", "fma_peak_gmacs" and "scaling" (fitted
// exponent of time vs context over contexts >= 4096).
BenchReport bench_attention(const AttentionBenchOptions& o);
// Fits the "scaling" extra and its table note from the report's rows (bench_attention calls it;
// `akv merge` calls it again over the merged rows of every shard).
void fit_attention_scaling(BenchReport& rep);
std::vector<BenchColumn> attention_columns();

}  // namespace akv
