#pragma once
// TurboQuant's KV cache rows as vLLM stores them (vllm/model_executor/layers/quantization/
// turboquant, vllm/v1/attention/ops/triton_turboquant_{store,decode}.py; docs/compress.md,
// "TurboQuant"): cache-only block types whose block is one whole row of head_dim values, stored
// by the ggml rows machinery (method `turboquant`, or `ggml:k=tq3nc:v=tqv4`).
//
// Keys (TQ<b>, TQ<b>NC; b = 2, 3, 4 bits): the row x (already rotated by the cache: Hadamard,
// kv/ggml_cache.h) is normalized, xh = x / (|x| + 1e-8), and each coordinate becomes the index
// of its Lloyd-Max level: the number of midpoints m_j <= xh_i. Stored: the indices packed
// b bits each (index i at bits [b i, b i + b) of the little-endian byte stream), then |x| as f16.
// Read back: c_i = centroid[index_i]; NC (norm correction) divides c by its own norm,
// c_i * (1 / sqrt(sum c^2 + 1e-16)) (the sum in eight lanes, element i in lane i mod 8, reduced
// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))); the row is f16(|x|) * c_i.
// Values (TQV<b>): uniform per row: mn = min, scale = (max - mn) / (2^b - 1) (at least 1e-8),
// q_i = trunc((x_i - mn) / scale + 0.5) clamped to [0, 2^b - 1], packed as the keys' indices,
// then f16 scale and f16 mn; read back as q_i * f16(scale) + f16(mn).
// Keys with QJL (TQ<b>J, TurboQuant_prod, the paper's Algorithm 2, as turboquant-pytorch's
// TurboQuantCompressorV2 stores keys): the row's first b - 1 bits per coordinate are TQ<b-1>'s
// (indices and the f16 norm, no norm correction), x_mse_i = f16(|x|) * centroid[index_i]; the
// residual r = x - x_mse gives d sign bits z_j = [(S r)_j >= 0] (bit j of the little-endian byte
// stream after the norm) and gamma = |r| as f16, S the d x d Gaussian matrix tq_qjl_matrix(d).
// Read back: x_mse_i + (sqrt(pi / 2) / d * f16(gamma)) * sum_j S_ji (2 z_j - 1), the sum over j in
// order: the asymmetric estimator <q, x_mse> + gamma sqrt(pi/2)/d <S q, 2z - 1> as a row.
// Every f32 operation in that order, no fused multiply-adds (this file builds with
// -ffp-contract=off).
//
// The codebook (tq_codebook): vLLM's solve_lloyd_max for N(0, 1/d), in double: 2^b levels
// started evenly on [-3.5 sigma, 3.5 sigma] (level i at lo + (hi - lo)(i + 0.5) / 2^b), then at
// most 200 Lloyd iterations: boundaries at the midpoints of neighbouring levels, outer edges
// 3 lo and 3 hi, each level moved to the conditional mean of its cell by the trapezoidal rule on
// 200 intervals (a level whose cell mass is <= 1e-15 stays), stopping once no level moved by
// 1e-10 or more (the moved levels are then not taken). Levels rounded to f32; the midpoints the
// store compares against are (c_i + c_{i+1}) / 2 in f32, as vLLM's launcher computes them.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "akv/tensor/ggml_blocks.h"

namespace akv {

enum class TqKind : std::uint8_t { key = 1, key_nc = 2, value = 3, key_qjl = 4 };

struct TqType {
  TqKind kind = TqKind::key;
  int bits = 3;               // 2, 3 or 4 (key_qjl: b - 1 of them for the levels, one for the signs)
  std::size_t head_dim = 0;   // a power of two, 8 to 512
};

// Bytes of one stored row: ceil(head_dim bits / 8) + 2 (keys: the norm) or + 4 (values: scale,
// minimum); key_qjl: ceil(head_dim (bits - 1) / 8) + 2 + head_dim / 8 + 2 (levels, norm, signs,
// gamma).
std::size_t tq_row_bytes(const TqType& t);
// Where a row's codes end: their bits per coordinate (b; key_qjl b - 1) and their bytes, after
// which the f16 norm (keys) or scale and minimum (values) follow (decode attention reads the
// codes in its vector loops and these fields per row).
int tq_code_bits(const TqType& t);
std::size_t tq_code_bytes(const TqType& t);
// The block type of t (block = head_dim, bytes = tq_row_bytes), or nullptr when head_dim or bits
// are outside the ranges above. Ids from kTqIdBase on; names TQ3_128, TQ3NC_128, TQ3J_128,
// TQV4_128.
inline constexpr std::uint32_t kTqIdBase = 0x20000;
const GgmlTypeInfo* tq_type_info(const TqType& t);
// The TurboQuant type of a block type, nullopt for others.
std::optional<TqType> tq_type_of(const GgmlTypeInfo& type);
// Every TurboQuant block type (for lookups by id or name).
const std::vector<GgmlTypeInfo>& tq_type_table();

struct TqCodebook {
  std::vector<float> centroids;  // 2^bits levels, ascending
  std::vector<float> midpoints;  // 2^bits - 1
};
// The codebook for rows of head_dim values (computed once per (head_dim, bits), then shared;
// bits 1 to 4; std::invalid_argument outside the supported head_dims and bits).
const TqCodebook& tq_codebook(std::size_t head_dim, int bits);

// n rows [n, head_dim] to n stored rows of t; and back (active_isa()'s loops: AVX2 unpacks and
// looks up eight elements at a time; every variant gives the same bits).
void tq_encode_rows(const TqType& t, const float* x, std::size_t n, std::uint8_t* dst);
void tq_decode_rows(const TqType& t, const std::uint8_t* src, std::size_t n, float* dst);
// QJL's projection S [head_dim, head_dim] row-major: i.i.d. standard normal from akv's Rng
// (core/rng.h) seeded with kTqQjlSeed and head_dim (stream_seed(kTqQjlSeed, {head_dim})), each
// rounded to f32; computed once per head_dim.
inline constexpr std::uint64_t kTqQjlSeed = 0x514A4C;  // "QJL"
const std::vector<float>& tq_qjl_matrix(std::size_t head_dim);
// key_qjl rows with another projection S [head_dim, head_dim] (what tq_encode_rows /
// tq_decode_rows do with tq_qjl_matrix): for the golden tests, whose S is the reference's.
void tq_qjl_encode_rows(const TqType& t, const float* S, const float* x, std::size_t n, std::uint8_t* dst);
void tq_qjl_decode_rows(const TqType& t, const float* S, const std::uint8_t* src, std::size_t n, float* dst);
// The QJL term of key_qjl rows against one query without reconstructing the rows (decode
// attention): prepared once per query, sq = S q (f32 sums in order), then per sign byte k the
// signed sums table[256 k + b] = sum_{i<8} sq[8k + i] (bit i of b ? 1 : -1), built as
// table[b & (b - 1)] + 2 sq[8k + lowest set bit of b] from table[0] = -sum_i sq[8k + i].
// sq and its sum are kept too: the decode loops read the sign bits as 0/1 codes, sum_i sq_i x
// (2 bit_i - 1) = 2 (sq . bits) - sum_i sq_i (tq_qjl_coefficients).
struct TqQjlQuery {
  std::vector<float> table;  // [head_dim / 8, 256]
  std::vector<float> sq;     // [head_dim]
  float sq_sum = 0.0f;       // sum_i sq_i, in order
};
// tables = false: sq and its sum only (the table stays empty).
TqQjlQuery tq_qjl_query(const TqType& t, const float* q, bool tables = true);
// x_mse of n key_qjl rows: their levels times the f16 norm (the row read back without the QJL
// term; the vector loops of the other key types where the level bits allow).
void tq_qjl_decode_levels(const TqType& t, const std::uint8_t* src, std::size_t n, float* dst);
// s[h * stride + r] += (sqrt(pi / 2) / head_dim * f16(gamma_r)) * sum_k q[h].table[256 k + sign
// byte k of row r] (k in order) for the n rows at src and nq queries: with tq_qjl_decode_levels,
// q . (read-back row) up to the order of the sums.
void tq_qjl_add_scores(const TqType& t, const TqQjlQuery* q, std::size_t nq, const std::uint8_t* src, std::size_t n,
                       float* s, std::size_t stride);
// key_qjl rows: the bytes before a row's sign bits (bit i of byte i / 8: whether S r_i >= 0)
// and before its f16 gamma (|r|); for n rows at src their QJL term's factor sqrt(pi / 2) /
// head_dim * f16(gamma_r) into coef (tq_qjl_factors: the same from n gathered gammas).
std::size_t tq_qjl_sign_offset(const TqType& t);
std::size_t tq_qjl_gamma_offset(const TqType& t);
void tq_qjl_coefficients(const TqType& t, const std::uint8_t* src, std::size_t n, float* coef);
void tq_qjl_factors(const TqType& t, const std::uint16_t* gamma, std::size_t n, float* coef);
// The first element of n (a multiple of head_dim) whose row has a non-finite f16 field, or n.
std::size_t tq_first_nonfinite(const TqType& t, const std::uint8_t* src, std::size_t n);

}  // namespace akv
