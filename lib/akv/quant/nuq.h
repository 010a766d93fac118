#pragma once
// KVQuant's non-uniform quantization ("nuq"; Hooper et al. 2024, arXiv 2401.18079), the numerics
// of its simulated-quantization module (SqueezeAILab/KVQuant quant/kvquant/
// simquant_module_quantizer.py: SimQuant.quantize to calibrate, QuantLinearSim.forward to
// quantize) on rows [n, C] of one layer: KVQuant's rows are a projection's outputs, every KV head's
// channels side by side; a caller may pass one head's. Keys are quantized per channel with
// thresholds fixed by a calibration, values per token with thresholds of the row itself; values
// outside the thresholds ("dense-and-sparse" outliers) and the first `sink` rows (attention sinks)
// stay exact; the others are normalized to [-1, 1] by the thresholds and rounded to the nearest of
// 2^bits levels fitted by k-means (one codebook per layer and tensor). Checked against KVQuant's
// code on the same rows:
// data/golden/kvquant-nuq.json (scripts/dev/golden/kvquant_nuq.py; tests/unit/test_golden.cpp).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace akv {

// numpy.percentile(x, q) with its default linear interpolation: x sorted ascending (n >= 1), q in
// [0, 100]; index q / 100 * (n - 1), numpy's lerp (a + (b - a) t, or b - (b - a)(1 - t) when
// t >= 0.5), in f64.
double percentile_sorted(const double* x, std::size_t n, double q);

// A 1-D weighted k-means: k levels that minimize sum_i w_i min_j (x_i - c_j)^2, by Lloyd's
// algorithm from the weighted quantiles (j + 1/2) / k of x: each round assigns every value to its
// nearest level (ties to the lower) and moves each level to its cluster's weighted mean (an empty
// cluster keeps its level), until no assignment changes or max_iter rounds. Deterministic; levels
// ascending; fewer distinct values than k give repeated levels. Weights > 0 (empty w: all 1).
// The fast path sorts once and finds clusters as runs between midpoints with prefix sums.
std::vector<double> kmeans_1d(const std::vector<double>& x, const std::vector<double>& w, std::size_t k,
                              std::size_t max_iter = 300);
// kmeans_1d's sorted input, made once for fits at several k (kmeans_1d(x, w, k) ==
// KMeansInput(x, w).fit(k)).
class KMeansInput {
 public:
  struct Sorted {
    std::vector<double> x, w;  // ascending x with their weights
    std::vector<double> pw;    // [n + 1] prefix sums of w (a running sum's)
  };
  KMeansInput(std::vector<double> x, std::vector<double> w);
  std::vector<double> fit(std::size_t k, std::size_t max_iter = 300) const;

 private:
  std::vector<double> x_, w_;  // as given (the cost of a fit sums in this order)
  Sorted sorted_;
  std::vector<double> pwx_;  // prefix sums of the sorted weighted values
};
// The same by the plain O(n k) assignment each round (the reference of the tests).
std::vector<double> kmeans_1d_ref(const std::vector<double>& x, const std::vector<double>& w, std::size_t k,
                                  std::size_t max_iter = 300);
// sum_i w_i min_j (x_i - levels_j)^2 (empty w: all 1).
double kmeans_1d_cost(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& levels);

struct NuqCalibration {
  int bits = 4;
  bool per_channel = true;           // keys: thresholds per channel (below); values: per row, at run time
  std::vector<double> upper, lower;  // per_channel: [C], SimQuant's f64 percentiles (used as f16)
  std::vector<float> levels;         // 2^bits levels in the normalized range, ascending
};

// SimQuant.quantize on rows [n, C] with dense-and-sparse outliers: t = 1 - (1 - sparsity) / 2;
// thresholds = the t and 1 - t percentiles (per_channel: of each channel over the rows; otherwise
// of each row over its channels); each value normalized by its thresholds (x - (u + l) / 2) /
// ((u - l) / 2); values beyond [-1, 1] and the first `sink` rows are outliers; the levels are
// kmeans_1d (k = 2^bits) of the others' normalized values rounded to f32 (KMeans's input), with
// `weights` [n, C] (sensitivity, e.g. Fisher information) or unweighted when null. sparsity in
// (0, 1]; InvalidInput when no value is left to fit.
// row_width (values only): thresholds per run of row_width channels of a row instead of the whole
// row (0: the whole row, KVQuant's; a cache of separate KV heads passes head_dim), as the
// quantization of such a cache normalizes them.
NuqCalibration calibrate_nuq(const float* rows, std::size_t n, std::size_t C, int bits, bool per_channel,
                             double sparsity, std::size_t sink, const float* weights = nullptr,
                             std::size_t row_width = 0);
// calibrate_nuq's thresholds and normalized values, made once for the levels of several bit widths
// (calibrate_nuq(..., bits, ...) == NuqFit(...).levels(bits)).
class NuqFit {
 public:
  NuqFit(const float* rows, std::size_t n, std::size_t C, bool per_channel, double sparsity, std::size_t sink,
         const float* weights = nullptr, std::size_t row_width = 0);
  NuqCalibration levels(int bits) const;

 private:
  bool per_channel_;
  std::vector<double> upper_, lower_;
  std::optional<KMeansInput> input_;
};

// The codebook of one stored tensor (method nuq, kv/stored_tensor.h): what decodes its rows.
//   per_channel (keys): each channel's thresholds, f16 bits (a calibration's, rounded f64 -> f32
//     -> f16 as torch converts them); offset (u + l) / 2 and range (u - l) / 2 in f16 arithmetic.
//   values: thresholds per row at quantiles `sparsity` of the row (below), nothing stored here.
// `sink`: rows below this index are kept as f16 copies (KVQuant's first_few_fp16).
struct NuqTable {
  int bits = 4;
  bool per_channel = false;
  double sparsity = 0.99;
  std::size_t sink = 0;
  std::vector<float> levels;                // 2^bits levels, ascending
  std::vector<std::uint16_t> upper, lower;  // per_channel: [width] f16 bits
  // Stored bytes: the levels (f32) and, per channel, the two f16 thresholds.
  std::size_t bytes() const { return 4 * levels.size() + 2 * (upper.size() + lower.size()); }
};

// A model's codebooks for method nuq at one key and one value bit width (akv calibrate;
// alloc/calibration_file.h read_calibration_nuq): per layer, keys per channel over the layer's
// [n_kv_heads * head_dim] channels, values per token and KV head.
struct NuqCodebooks {
  double sparsity = 0.99;
  std::size_t sink = 1;
  std::vector<NuqCalibration> key, value;  // [layer]
};

// The table of channels [first, first + width) of a calibration (keys: a KV head's channels of a
// layer's [C] thresholds).
NuqTable nuq_table(const NuqCalibration& c, double sparsity, std::size_t sink, std::size_t first, std::size_t width);

// What a stored nuq tensor holds, rows in order: the first `sink_rows` as f16 copies, then each
// row as one code per channel (the index of its level, packed `bits` per code, a row of
// packed_size(width, bits) bytes; 0 at outliers), values' per-row f32 offset and range, and its
// outliers ("dense-and-sparse": channel u16 and f16 value, in channel order; outlier_end[r] is
// the count up to and with quantized row r).
struct NuqView {
  const NuqTable* table = nullptr;
  std::size_t rows = 0, sink_rows = 0;  // rows counts the sink rows
  const std::uint16_t* sink = nullptr;  // [sink_rows, width]
  const std::uint8_t* codes = nullptr;  // [rows - sink_rows, row bytes]
  const float* offset = nullptr;        // values: [rows - sink_rows]
  const float* range = nullptr;
  const std::uint32_t* outlier_end = nullptr;  // [rows - sink_rows]
  const std::uint16_t* outlier_channel = nullptr;
  const std::uint16_t* outlier_value = nullptr;  // f16 bits
};

// Growable storage of rows encoded under one table.
struct NuqRows {
  std::size_t sink_rows = 0, rows = 0;
  std::vector<std::uint16_t> sink;
  std::vector<std::uint8_t> codes;
  std::vector<float> offset, range;
  std::vector<std::uint32_t> outlier_end;
  std::vector<std::uint16_t> outlier_channel, outlier_value;
  NuqView view(const NuqTable& t) const;
  // Bytes a cache stores: codes, values' offset and range (f32 each), sink rows (f16), outlier
  // values (f16), outlier channels (u16) and one u16 count per quantized row.
  std::uint64_t code_bytes() const { return codes.size(); }
  std::uint64_t scale_bytes() const { return 4 * (offset.size() + range.size()); }
  std::uint64_t sink_bytes() const { return 2 * sink.size(); }
  std::uint64_t outlier_bytes() const { return 2 * outlier_value.size(); }
  std::uint64_t index_bytes() const { return 2 * (outlier_channel.size() + outlier_end.size()); }
};

// Appends rows [n, width] encoded as nuq_quantize rounds them (below); width at most 65536. A
// row is a sink row (kept in f16) when its position is below t.sink: `pos` [n] gives the
// positions (ascending across calls, as a cache after eviction keeps them), null = the rows are
// positions out.rows, out.rows + 1, ... . Sink rows must come first (std::logic_error otherwise).
void nuq_encode(const NuqTable& t, const float* rows, std::size_t n, std::size_t width, NuqRows& out,
                const std::int32_t* pos = nullptr);
// Rows [r0, r1) of a view decoded into out [r1 - r0, width]: levels[code] * range + offset in
// f32 (0 if not finite), outliers their stored value, every value rounded to f16.
// AVX2 + F16C when compiled for x86-64-v3 and bits 2-4 (codes read eight at a time from the
// packed row, levels by permutes; a value row's levels scaled once per row; with AVX-512 at run
// time, sixteen at a time for 2 and 4 bits: quant/nuq_avx512.h), bitwise equal to
// nuq_decode_ref, the plain loop over codes unpacked bit by bit (tests/unit/test_quant.cpp).
void nuq_decode(const NuqView& v, std::size_t width, std::size_t r0, std::size_t r1, float* out);
// A per-channel table's offset and range of each of its `width` channels (what nuq_decode scales
// the levels by).
void nuq_channel_params(const NuqTable& t, std::size_t width, std::vector<float>& offset, std::vector<float>& range);
void nuq_decode_ref(const NuqView& v, std::size_t width, std::size_t r0, std::size_t r1, float* out);

// The index of the level nearest y (levels ascending, at least one): the smallest |y - level| in
// f32, ties to the lower; 0 for a y that is not finite (a zero range). The reference by binary
// search; NuqNearest, what nuq_encode codes with, counts the levels <= y of up to 16 levels (2-4
// bits) in one branch-free pass over them padded with +inf (codes: a row at a time, each level
// against vectors of its values), and searches more (8 bits) as the reference does (the same
// index for every y: tests/unit/test_quant.cpp).
std::uint8_t nuq_nearest_ref(const std::vector<float>& levels, float y);
class NuqNearest {
 public:
  explicit NuqNearest(const std::vector<float>& levels);  // kept by reference: must outlive this
  std::uint8_t operator()(float y) const;
  void codes(const float* y, std::size_t n, std::uint8_t* out) const;  // out[j] = (*this)(y[j])

 private:
  const std::vector<float>& levels_;
  float padded_[16];
};

// QuantLinearSim.forward's quantization of rows [n, C] into out [n, C], rounded to f16 as it
// returns them (nuq_encode then nuq_decode); returns the number of outliers (the sink rows'
// values included).
//   per_channel (keys): thresholds = the calibration's, rounded to f32 and then to f16 (as torch
//     converts f64 to f16); outliers < lower or >
//     upper; offset = (u + l) / 2 and range = (u - l) / 2 in f16 arithmetic.
//   values: thresholds = the row's torch.quantile at t and 1 - t (f32); outliers <= lower or >=
//     upper; offset and range (f32) from the row's max and min with its outliers replaced by its
//     median (the lower of the two middle values).
//   Then, in f32: (x - offset) / range rounded to the nearest level (smallest |y - level| in f32,
//   ties to the lower), times range, plus offset; an outlier is (x - offset) + offset; the first
//   `sink` rows are copied.
std::size_t nuq_quantize(const NuqCalibration& c, const float* rows, std::size_t n, std::size_t C, double sparsity,
                         std::size_t sink, float* out);

}  // namespace akv
