#include "akv/kv/ggml_cache.h"

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "akv/alloc/calibration_file.h"
#include "akv/core/errors.h"
#include "akv/core/parallel.h"
#include "akv/kv/prompt_plan.h"
#include "akv/kv/stored_head.h"
#include "akv/kv/tensor_builder.h"
#include "akv/tensor/turboquant.h"

namespace akv {
namespace {

// One KV head of one layer: its rows as ggml blocks (kv/tensor_builder.h).
struct HeadStore {
  TensorBuilder key, value;
  std::vector<std::int32_t> position;
};

class GgmlCachePolicy : public KvPolicy {
 public:
  GgmlCachePolicy(const CompressParams& given, const KvGeometry& g, int threads)
      : scale_(given.ggml()->scale), g_(g), threads_(threads) {
    CompressParams params = given;
    read_calibration_inputs(params, g.prompt_window());  // per-head types (types=)
    const GgmlCacheParams& gp = *params.ggml();
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) {  // boundary layers: f16 (GgmlCacheParams::boundary)
      const std::size_t l = i / g.n_kv_heads, h = i % g.n_kv_heads;
      const HeadType kn = parse_head_type(gp.key_type(l, h, g.n_layers, g.n_kv_heads), "", "ggml k");
      const HeadType vn = parse_head_type(gp.value_type(l, h, g.n_layers, g.n_kv_heads), "", "ggml v");
      const GgmlTypeInfo& k = ggml_cache_type(kn.name, g.head_dim, "", "ggml k=" + kn.name + ": head_dim");
      const GgmlTypeInfo& v = ggml_cache_type(vn.name, g.head_dim, "", "ggml v=" + vn.name + ": head_dim");
      check_ggml_head_dim(k, g.head_dim, "", "ggml k=" + kn.name + ": head_dim");
      check_ggml_head_dim(v, g.head_dim, "", "ggml v=" + vn.name + ": head_dim");
      types_.push_back({&k, &v, head_type_rotation(kn, params.rotate, params.rotate_seed, k, g.head_dim, true),
                        head_type_rotation(vn, params.rotate, params.rotate_seed, v, g.head_dim, false)});
    }
    if (!params.ggml()->calibration.empty()) calibrated_scales(params);
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) heads_.push_back(empty_head(i));
  }

  void ingest_prompt(const PromptKv& prompt) override {
    for (std::size_t l = 0; l < g_.n_layers; ++l) share_scales(l, prompt.key[l], prompt.value[l]);
    parallel_for(heads_.size(), threads_, [&](std::size_t i) {
      const std::size_t l = i / g_.n_kv_heads;
      store_head(i, prompt.key[l], prompt.value[l]);
    });
  }

  bool takes_prompt_layers() const override { return true; }

  void ingest_prompt_layer(std::size_t layer, const LayerKv& kv) override {
    share_scales(layer, *kv.key, *kv.value);
    parallel_for(g_.n_kv_heads, threads_, [&](std::size_t h) { store_head(layer * g_.n_kv_heads + h, *kv.key, *kv.value); });
  }

  void ingest_layer(std::size_t layer, const LayerKv& kv, const PromptPlan&) override {
    share_scales(layer, *kv.key, *kv.value);
    parallel_for(g_.n_kv_heads, threads_, [&](std::size_t h) { store_head(layer * g_.n_kv_heads + h, *kv.key, *kv.value); });
  }

  HeadCache take_head(std::size_t layer, std::size_t head) override {
    HeadStore& s = heads_[layer * g_.n_kv_heads + head];
    HeadCache h;
    h.n_tokens = s.position.size();
    h.head_dim = g_.head_dim;
    h.key = s.key.take();
    h.value = s.value.take();
    s = empty_head(layer * g_.n_kv_heads + head);
    return h;
  }

  void append(std::size_t layer, const float* key, const float*, const float* value, std::size_t pos) override {
    const auto p = static_cast<std::int32_t>(pos);
    if (scale_ == "tensor" && key_scale_.empty() && heads_[layer * g_.n_kv_heads].position.empty()) {  // no prompt: this token sets them
      set_layer_scales(layer, [&](std::size_t h, bool k) { return (k ? key : value) + h * g_.head_dim; }, 1);
    }
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      HeadStore& s = heads_[layer * g_.n_kv_heads + h];
      s.key.append(key + h * g_.head_dim, key + h * g_.head_dim, &p, 1);
      s.value.append(value + h * g_.head_dim, value + h * g_.head_dim, &p, 1);
      s.position.push_back(p);
    }
  }

  KvView view(std::size_t layer, std::size_t kv_head) const override {
    const HeadStore& s = heads_[layer * g_.n_kv_heads + kv_head];
    KvView v;
    v.n = s.position.size();
    v.position = s.position.data();
    v.segments[0] = {s.key.view(), s.value.view()};
    return v;
  }

  std::uint64_t bytes() const override {
    std::uint64_t b = 0;
    for (std::size_t l = 0; l < g_.n_layers; ++l) b += layer_bytes(l);
    return b;
  }

  bool layer_local() const override { return true; }

  std::uint64_t layer_bytes(std::size_t layer) const override {
    std::uint64_t b = 0;
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      const HeadStore& s = heads_[layer * g_.n_kv_heads + h];
      b += s.key.bytes() + s.value.bytes();
    }
    return b;
  }

 private:
  // Head i's builders; fp8 scales fixed now with scale=one or a calibration (the builders' own
  // rule, the first rows' maximum, is scale=head's; share_scales does scale=tensor's).
  HeadStore empty_head(std::size_t i) const {
    const HeadTypes& t = types_[i];
    HeadStore s{TensorBuilder(g_.head_dim, *t.key, t.key_rot), TensorBuilder(g_.head_dim, *t.value, t.value_rot), {}};
    if (scale_ == "one") {
      s.key.set_scale(1.0f);
      s.value.set_scale(1.0f);
    } else if (!key_scale_.empty()) {
      s.key.set_scale(key_scale_[i]);
      s.value.set_scale(value_scale_[i]);
    }
    return s;
  }

  // Scales from an `akv calibrate` file: each head's maximum (scale=head) or its layer's
  // (scale=tensor) over the format's largest value. The file's rows were rotated as this cache
  // rotates them (random: seed 0), or UsageError.
  void calibrated_scales(const CompressParams& params) {
    const std::string& path = params.ggml()->calibration;
    const CalibrationAmax c = read_calibration_amax(path, g_);
    if (c.rotate != rotation_name(params.rotate) || (params.rotate == RotationKind::random && params.rotate_seed != 0)) {
      throw UsageError("the calibration's maxima were measured with rotate=" + c.rotate + " (random: seed 0); this cache rotates " +
                           rotation_name(params.rotate) + (params.rotate == RotationKind::random ? " seed " + std::to_string(params.rotate_seed) : ""),
                       {path, "params.rotate", c.rotate});
    }
    const std::size_t H = g_.n_kv_heads;
    key_scale_.assign(g_.n_layers * H, 1.0f);
    value_scale_.assign(g_.n_layers * H, 1.0f);
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      double lk = 0, lv = 0;
      for (std::size_t h = 0; h < H; ++h) {
        lk = std::max(lk, c.amax[l * H + h].first);
        lv = std::max(lv, c.amax[l * H + h].second);
      }
      for (std::size_t h = 0; h < H; ++h) {
        const bool tensor = scale_ == "tensor";
        const auto ka = static_cast<float>(tensor ? lk : c.amax[l * H + h].first);
        const auto va = static_cast<float>(tensor ? lv : c.amax[l * H + h].second);
        if (const auto f = fp8_format_of(*types_[l * H + h].key)) key_scale_[l * H + h] = fp8_scale_for(ka, *f);
        if (const auto f = fp8_format_of(*types_[l * H + h].value)) value_scale_[l * H + h] = fp8_scale_for(va, *f);
      }
    }
  }

  // scale=tensor: one fp8 scale for the layer's keys and one for its values, from the maximum
  // over its KV heads of the rows they will store (n rows per head, `rows(h, key)`); with
  // per-head types, over the heads of each fp8 format.
  void set_layer_scales(std::size_t layer, const std::function<const float*(std::size_t, bool)>& rows, std::size_t n) {
    const std::size_t H = g_.n_kv_heads;
    for (const bool key : {true, false}) {
      for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        auto holds = [&](std::size_t h) {
          const auto t = fp8_format_of(key ? *types_[layer * H + h].key : *types_[layer * H + h].value);
          return t && *t == f;
        };
        float a = 0.0f;
        bool any = false;
        for (std::size_t h = 0; h < H; ++h) {
          if (!holds(h)) continue;
          const HeadStore& s = heads_[layer * H + h];
          a = std::max(a, (key ? s.key : s.value).stored_amax(rows(h, key), n));
          any = true;
        }
        if (!any) continue;
        for (std::size_t h = 0; h < H; ++h) {
          if (holds(h)) (key ? heads_[layer * H + h].key : heads_[layer * H + h].value).set_scale(fp8_scale_for(a, f));
        }
      }
    }
  }
  void share_scales(std::size_t layer, const Tensor3& key, const Tensor3& value) {
    if (scale_ != "tensor" || !key_scale_.empty()) return;
    set_layer_scales(layer, [&](std::size_t h, bool k) { return (k ? key : value).row(h, 0); }, key.dim1());
  }

  // Every row of KV head (i mod n_kv_heads) of `key` and `value` [n_kv_heads, n, hd] into head i.
  void store_head(std::size_t i, const Tensor3& key, const Tensor3& value) {
    const std::size_t h = i % g_.n_kv_heads, n = key.dim1();
    HeadStore& s = heads_[i];
    s.position.resize(n);
    for (std::size_t t = 0; t < n; ++t) s.position[t] = static_cast<std::int32_t>(t);
    s.key.append(key.row(h, 0), key.row(h, 0), s.position.data(), n);
    s.value.append(value.row(h, 0), value.row(h, 0), s.position.data(), n);
  }

  struct HeadTypes {
    const GgmlTypeInfo* key;
    const GgmlTypeInfo* value;
    Rotation key_rot, value_rot;
  };
  std::vector<HeadTypes> types_;  // [layer * n_kv_heads + head]: the stored types and their rotations
  std::string scale_;  // fp8 scale rule: head, tensor, one
  std::vector<float> key_scale_, value_scale_;  // [layer * n_kv_heads + head] from a calibration, or empty
  KvGeometry g_;
  int threads_;
  std::vector<HeadStore> heads_;
};

}  // namespace

Rotation ggml_rotation(RotationKind kind, std::uint64_t seed, const GgmlTypeInfo& type, std::size_t head_dim,
                       bool key) {
  // f16 rows and TurboQuant's values (vLLM quantizes them unrotated) are stored as given.
  const auto tq = tq_type_of(type);
  if (std::string_view(type.name) == "F16" || (tq && tq->kind == TqKind::value)) return Rotation{};
  return tensor_rotation(kind, seed, head_dim, key);
}

Rotation head_type_rotation(const HeadType& t, RotationKind kind, std::uint64_t seed, const GgmlTypeInfo& type,
                            std::size_t head_dim, bool key) {
  return t.rotate ? ggml_rotation(*t.rotate, 0, type, head_dim, key) : ggml_rotation(kind, seed, type, head_dim, key);
}

std::unique_ptr<KvPolicy> make_ggml_policy(const CompressParams& p, const KvGeometry& g, int threads) {
  return std::make_unique<GgmlCachePolicy>(p, g, threads);
}

}  // namespace akv
