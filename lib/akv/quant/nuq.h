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
NuqCalibration calibrate_nuq(const float* rows, std::size_t n, std::size_t C, int bits, bool per_channel,
                             double sparsity, std::size_t sink, const float* weights = nullptr);

// QuantLinearSim.forward's quantization of rows [n, C] into out [n, C], rounded to f16 as it
// returns them; returns the number of outliers (the sink rows' values included).
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
