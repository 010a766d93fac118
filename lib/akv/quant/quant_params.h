#pragma once
// What a quantizer is told (the quantizer and its parameters for keys and values), and how many
// rows of a tensor it quantizes; the stored form of a head is kv/stored_head.h.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "akv/quant/affine.h"
#include "akv/quant/nuq.h"
#include "akv/quant/rotation.h"

namespace akv {

// The quantizers (docs/compress.md):
//   none     f16 copy of K and V: the baseline every ratio is measured against.
//   uniform  one bit width for K and V, groups along the token axis, no residual window.
//   kivi     KIVI: keys per channel, values per token, the most recent R tokens in f16.
//   nuq      KVQuant's non-uniform codebooks (quant/nuq.h): every row coded at once under a
//            table a calibration fitted (nuq_key, nuq_value), no residual window.
enum class Quantizer { none, uniform, kivi, nuq };
std::string quantizer_name(Quantizer q);

// Quantization of one tensor (keys or values).
struct TensorQuant {
  int bits = 4;
  QuantAxis axis = QuantAxis::token;
  std::size_t group = 32;
  // A head of a joint plan whose tensor is stored as a cache type (method/ggml_params.h
  // parse_head_type: "q4_0", "fp8_e4m3+hadamard"; CompressParams::head_tensor_types) instead of
  // the quantizer's codes; empty: the quantizer's codes. Set per head only, never in a file's
  // top-level parameters.
  std::string type = {};
};

// What one head's codec needs: the quantizer and its parameters.
struct QuantParams {
  Quantizer method = Quantizer::kivi;
  TensorQuant key{2, QuantAxis::channel, 32};
  TensorQuant value{2, QuantAxis::token, 32};
  QuantRule rule = QuantRule::kivi;  // group parameters, codes and key residual (affine.h)
  std::size_t residual = 128;    // most recent tokens kept in f16
  double outlier_fraction = 0;   // key channels per head kept in f16: ceil(f * head_dim)
  bool pre_rope = false;         // quantize keys before RoPE (needs key_pre_rope in the dump)
  RotationKind rotate = RotationKind::none;  // rows rotated before quantization (rotation.h)
  std::uint64_t rotate_seed = 0;             // random rotation's signs
  // nuq: the codebooks of one head's keys and values (bits as key.bits / value.bits), set per
  // head from a calibration.
  std::shared_ptr<const NuqTable> nuq_key, nuq_value;

  bool quantized() const { return method != Quantizer::none; }
  // The rotation of the key or value tensor of a head (none unless quantized and rotate is set).
  Rotation rotation(std::size_t head_dim, bool key) const {
    return quantized() ? tensor_rotation(rotate, rotate_seed, head_dim, key) : Rotation{};
  }
};

// Leading rows of n that a tensor quantizes (the rest stay in f16 as the residual window):
//   token axis:                 n - min(n, R);
//   channel axis, rule kivi:    n - n mod R (KIVI: the newest n mod R keys wait in f16 until R
//                               of them are quantized at once; R = 0: floor(n / G) G);
//   channel axis, rule bounded: floor((n - min(n, R)) / G) G (R to R + G - 1 keys in f16).
std::size_t quantized_rows(std::size_t n, QuantAxis axis, std::size_t group, std::size_t residual,
                           QuantRule rule);
inline std::size_t quantized_rows(std::size_t n, const TensorQuant& t, const QuantParams& p) {
  if (p.method == Quantizer::nuq) return n;
  return p.quantized() ? quantized_rows(n, t.axis, t.group, p.residual, p.rule) : 0;
}

}  // namespace akv
