#include <catch2/catch.hpp>
#include <algorithm>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/io/token_file.h"
#include "akv/kv/cache_file.h"
#include "akv/kv/compress.h"
#include "akv/kv/runtime.h"
#include "akv/kv/stored_tensor.h"
#include "akv/method/registry.h"
#include "akv/model/llama2c.h"
#include "akv/synth/synth.h"
#include "akv/tensor/half.h"
#include "test_util.h"

using namespace akv;
using test::have_shared;
using test::shared_dir;

namespace {

CompressParams params(const std::string& spec) { return resolve_params(parse_method_spec(spec)); }

KvGeometry geometry(const Model& m) {
  const ModelConfig& c = m.config();
  return {c.kv_shape(), c.seq_len};
}

bool ascending(const std::int32_t* p, std::size_t n) {
  for (std::size_t i = 1; i < n; ++i) {
    if (p[i - 1] >= p[i]) return false;
  }
  return true;
}

// Every invariant of the tiered cache on every (layer, head) after `n` tokens.
void check_invariants(const KvPolicy& cache, const ModelConfig& c, const TieredParams& t, std::size_t n) {
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    for (std::size_t h = 0; h < c.n_kv_heads; ++h) {
      const KvView v = cache.view(l, h);
      const std::size_t warm = v.segments[0].rows(), cold = v.segments[1].rows(), hot = v.segments[2].rows();
      INFO("layer " << l << " head " << h << " tokens " << n);
      REQUIRE(warm + cold + hot == n);  // conservation: nothing is evicted
      REQUIRE(v.n == n);
      REQUIRE(hot <= t.hot);
      if (t.warm) REQUIRE(warm <= *t.warm);
      REQUIRE(ascending(v.position, warm));  // chronological inside each tier
      REQUIRE(ascending(v.position + warm, cold));
      REQUIRE(ascending(v.position + warm + cold, hot));
      std::vector<std::int32_t> all(v.position, v.position + n);
      std::sort(all.begin(), all.end());
      std::vector<std::int32_t> expect(n);
      std::iota(expect.begin(), expect.end(), 0);
      REQUIRE(all == expect);
      for (std::size_t r = 0; r < warm + cold; ++r) {  // protected positions are hot
        const auto p = static_cast<std::size_t>(v.position[r]);
        REQUIRE(p >= t.protect_first);
        REQUIRE(p + t.protect_last < n);
      }
    }
  }
}

// KIVI as in its reference code: the newest tokens in f16 (rounded as the tiered cache stores
// them); whenever a whole group of G tokens lies before the last R, keys (per channel) and
// values (per token) of that group are quantized together.
class BlockKivi : public KvPolicy {
 public:
  BlockKivi(const KvGeometry& g, std::size_t r, int bk, int bv) : g_(g), r_(r), bk_(bk), bv_(bv) {
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) {
      k_.emplace_back(g.head_dim, DenseType::f16);
      v_.emplace_back(g.head_dim, DenseType::f16);
      pending_.emplace_back();
      pos_.emplace_back();
    }
  }
  void ingest_prompt(const PromptKv& p) override {
    for (std::size_t t = 0; t < p.n_tokens; ++t) {
      for (std::size_t l = 0; l < g_.n_layers; ++l) {
        for (std::size_t h = 0; h < g_.n_kv_heads; ++h) add(l * g_.n_kv_heads + h, p.key[l].row(h, t), p.value[l].row(h, t));
      }
    }
  }
  void append(std::size_t l, const float* k, const float*, const float* v, std::size_t) override {
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) add(l * g_.n_kv_heads + h, k + h * g_.head_dim, v + h * g_.head_dim);
  }
  KvView view(std::size_t l, std::size_t h) const override {
    const std::size_t i = l * g_.n_kv_heads + h;
    KvView v;
    const TensorView k = k_[i].view(), val = v_[i].view();
    v.segments[0].key.packed = k.packed;
    v.segments[0].value.packed = val.packed;
    v.segments[2].key.dense = k.dense;
    v.segments[2].value.dense = val.dense;
    v.position = pos_[i].data();
    v.n = pos_[i].size();
    return v;
  }
  std::uint64_t bytes() const override {
    std::uint64_t b = 0;
    for (std::size_t i = 0; i < k_.size(); ++i) b += k_[i].bytes() + v_[i].bytes();
    return b;
  }

 private:
  void add(std::size_t i, const float* k, const float* v) {
    const std::size_t d = g_.head_dim, G = 32;
    std::vector<float> kr(d), vr(d);
    for (std::size_t c = 0; c < d; ++c) {
      kr[c] = f16_to_f32_ref(f32_to_f16_ref(k[c]));
      vr[c] = f16_to_f32_ref(f32_to_f16_ref(v[c]));
    }
    k_[i].append_dense(kr.data(), 1);
    v_[i].append_dense(vr.data(), 1);
    pending_[i].insert(pending_[i].end(), kr.begin(), kr.end());
    pending_[i].insert(pending_[i].end(), vr.begin(), vr.end());
    pos_[i].push_back(static_cast<std::int32_t>(pos_[i].size()));
    const std::size_t n = pos_[i].size(), quantized = k_[i].packed_rows();
    if (n >= r_ && n - r_ >= quantized + G) {
      std::vector<float> kb(G * d), vb(G * d);
      for (std::size_t t = 0; t < G; ++t) {
        std::copy_n(pending_[i].data() + 2 * t * d, d, kb.data() + t * d);
        std::copy_n(pending_[i].data() + (2 * t + 1) * d, d, vb.data() + t * d);
      }
      k_[i].append_packed(quantize_block(kb.data(), G, d, QuantAxis::channel, bk_, G, QuantRule::bounded), {}, nullptr);
      v_[i].append_packed(quantize_block(vb.data(), G, d, QuantAxis::token, bv_, 32, QuantRule::bounded), {}, nullptr);
      k_[i].drop_dense_front(G);
      v_[i].drop_dense_front(G);
      pending_[i].erase(pending_[i].begin(), pending_[i].begin() + static_cast<std::ptrdiff_t>(2 * G * d));
    }
  }
  KvGeometry g_;
  std::size_t r_;
  int bk_, bv_;
  std::vector<PackedTensor> k_, v_;
  std::vector<std::vector<float>> pending_;
  std::vector<std::vector<std::int32_t>> pos_;
};

}  // namespace

TEST_CASE("tiered cache: budgets, conservation, order, protected tokens, determinism", "[tiered]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const auto& seq = seqs[3];
  const std::size_t P = 150;
  const PrefillResult pre = m.prefill(std::vector<std::int32_t>(seq.begin(), seq.begin() + P), false);
  for (const std::string spec : {"balanced:warm=64", "quality:hot=160:warm=64:anchors=40:w-recency=0.5",
                                 "tiered:preset=k4v2:warm=64:cold-bits=16:demotion=fifo",
                                 "compact:warm=32:decay=0.5"}) {
    INFO(spec);
    const CompressParams p = params(spec);
    std::vector<std::vector<float>> logits[2];
    for (int run = 0; run < 2; ++run) {
      auto cache = make_kv_policy(p, geometry(m));
      cache->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P});
      check_invariants(*cache, m.config(), *p.tiered(), P);
      for (std::size_t pos = P; pos < P + 120; ++pos) {
        logits[run].push_back(m.decode(seq[pos], pos, *cache));
        check_invariants(*cache, m.config(), *p.tiered(), pos + 1);
      }
      const TierBytes b = *cache->tier_bytes();
      CHECK(b.hot_tokens + b.warm_tokens + b.cold_tokens == (P + 120) * m.config().n_layers * m.config().n_kv_heads);
      CHECK(b.cold_tokens > 0);
      CHECK(b.hot + b.warm + b.cold == cache->bytes());
    }
    CHECK(logits[0] == logits[1]);  // migration is deterministic
  }
}

TEST_CASE("tiered fifo without anchors equals a KIVI residual cache (bytes and logits)", "[tiered]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const auto& seq = seqs[7];
  const std::size_t P = 100, R = 64;
  const PrefillResult pre = m.prefill(std::vector<std::int32_t>(seq.begin(), seq.begin() + P), false);
  // hot = R + G - 1 with the last R protected: exactly the groups older than the last R leave.
  auto tiered = make_kv_policy(params("tiered:preset=k4v2:demotion=fifo:hot=95:protect-last=64:protect-first=0"),
                               geometry(m));
  BlockKivi ref(geometry(m), R, 4, 2);
  const PromptKv pk{&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P};
  tiered->ingest_prompt(pk);
  ref.ingest_prompt(pk);
  CHECK(tiered->bytes() == ref.bytes());
  auto same_views = [&]() {
  for (std::size_t l = 0; l < m.config().n_layers; ++l) {
      for (std::size_t h = 0; h < m.config().n_kv_heads; ++h) {
        const KvView a = tiered->view(l, h), b = ref.view(l, h);
        for (std::size_t s = 0; s < kKvSegments; ++s) {
          INFO("segment " << s << " layer " << l << " head " << h);
          REQUIRE(a.segments[s].rows() == b.segments[s].rows());
          const std::size_t n = a.segments[s].rows(), d = m.config().head_dim;
          std::vector<float> x(n * d), y(n * d);
          dequantize_rows(a.segments[s].key, d, 0, n, x.data());
          dequantize_rows(b.segments[s].key, d, 0, n, y.data());
          REQUIRE(x == y);
          dequantize_rows(a.segments[s].value, d, 0, n, x.data());
          dequantize_rows(b.segments[s].value, d, 0, n, y.data());
          REQUIRE(x == y);
        }
      }
    }
  };
  same_views();
  for (std::size_t pos = P; pos < P + 150; ++pos) {
    const auto a = m.decode(seq[pos], pos, *tiered);
    const auto b = m.decode(seq[pos], pos, ref);
    same_views();
    REQUIRE(a == b);
    REQUIRE(tiered->bytes() == ref.bytes());
  }
}

TEST_CASE("tiered with cold-bits 16 and no warm tier is lossless f16", "[tiered]") {
  if (!have_shared()) {
    WARN("skipped: shared model not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto seqs = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const auto& seq = seqs[9];
  const std::size_t P = 300, d = m.config().head_dim;
  const PrefillResult pre = m.prefill(std::vector<std::int32_t>(seq.begin(), seq.begin() + P), false);
  auto tiered = make_kv_policy(params("compact:warm=0:cold-bits=16"), geometry(m));
  auto f16 = make_kv_policy(params("none"), geometry(m));
  const PromptKv pk{&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, P};
  tiered->ingest_prompt(pk);
  f16->ingest_prompt(pk);
  // Every row, wherever it lives, is the f16 rounding of the model's value.
  for (std::size_t l = 0; l < m.config().n_layers; ++l) {
    for (std::size_t h = 0; h < m.config().n_kv_heads; ++h) {
      const KvView v = tiered->view(l, h);
      REQUIRE(v.segments[1].rows() > 0);
      std::size_t row = 0;
      for (const HeadView& s : v.segments) {
        std::vector<float> k(s.rows() * d), val(k.size());
        dequantize_rows(s.key, d, 0, s.rows(), k.data());
        dequantize_rows(s.value, d, 0, s.rows(), val.data());
        for (std::size_t r = 0; r < s.rows(); ++r, ++row) {
          const auto p = static_cast<std::size_t>(v.position[row]);
          for (std::size_t c = 0; c < d; ++c) {
            REQUIRE(k[r * d + c] == f16_to_f32_ref(f32_to_f16_ref(pre.key[l].row(h, p)[c])));
            REQUIRE(val[r * d + c] == f16_to_f32_ref(f32_to_f16_ref(pre.value[l].row(h, p)[c])));
          }
        }
      }
    }
  }
  // The same attention up to summation order, which can flip the f16 rounding of a decoded row
  // (1e-3 of it) and so move later logits by ~1e-3 of their scale (up to 3e-3 at logits of 15 in
  // an -O1 build): within 1e-3 of the step's largest logit, plus 1e-3.
  for (std::size_t pos = P; pos < P + 20; ++pos) {
    const auto a = m.decode(seq[pos], pos, *tiered);
    const auto b = m.decode(seq[pos], pos, *f16);
    float scale = 0.0f;
    for (const float x : b) scale = std::max(scale, std::abs(x));
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 1e-3f * (1.0f + scale));
  }
  CHECK(tiered->tier_bytes()->warm == 0);
  CHECK(tiered->bytes() == f16->bytes());  // the same f16 rows, hot or offloaded
}

TEST_CASE("tiered parameters: presets, flags and budgets that cannot be met", "[tiered]") {
  const CompressParams q = params("quality");
  REQUIRE(q.tiered());
  CHECK(q.tiered()->hot == 256);
  CHECK(q.tiered()->warm_bits_key == 4);
  CHECK(params("compact").tiered()->warm_bits_value == 2);
  CHECK(params("tiered:preset=k4v3").tiered()->warm_bits_value == 3);
  CHECK(params("balanced:demotion=fifo").tiered()->demotion == Demotion::fifo);
  CHECK_THROWS_AS(params("tiered:preset=huge"), InvalidInput);
  CHECK_THROWS_AS(params("balanced:cold-bits=5"), InvalidInput);
  CHECK_THROWS_AS(params("balanced:demotion=lru"), InvalidInput);
  CHECK_THROWS_AS(params("kivi-2:hot=64"), UsageError);
  CHECK_THROWS_AS(params("balanced:bits=4"), UsageError);
  const KvGeometry g{{2, 4, 2, 64, 10000.0, RopeLayout::rotate_half, ""}, 512};
  CHECK_THROWS_AS(make_kv_policy(params("compact:protect-last=32"), g), InvalidInput);
  CHECK_THROWS_AS(make_kv_policy(params("balanced:warm=40"), g), InvalidInput);
  CHECK_NOTHROW(make_kv_policy(params("balanced:warm=64"), g));
}

TEST_CASE("tiered compress of a dump: segments, file round trip, fifo equals block KIVI", "[tiered]") {
  test::TempDir dir;
  SynthOptions so;
  so.n_layers = 2;
  so.n_heads = 4;
  so.n_kv_heads = 2;
  so.head_dim = 64;
  so.n_tokens = 300;
  write_synth_dump(dir.file("d.h5"), so);
  const std::size_t n = 300, d = 64, R = 64;
  const CompressParams p = params("tiered:preset=k4v2:demotion=fifo:hot=95:protect-last=64:protect-first=0");
  const MemoryReport rep = compress_dump(dir.file("d.h5"), dir.file("c.h5"), p, 2, {});
  const CacheReader cache(dir.file("c.h5"));
  CHECK(cache.version() == 2);
  REQUIRE(cache.header().params.tiered());
  CHECK(cache.header().params.tiered()->demotion == Demotion::fifo);
  const DumpReader dump(dir.file("d.h5"));
  const std::size_t quantized = (n - R) / 32 * 32;  // whole blocks older than the last R tokens
  std::uint64_t total = 0;
  auto f16 = [](float x) { return f16_to_f32_ref(f32_to_f16_ref(x)); };
  for (std::size_t l = 0; l < 2; ++l) {
    const Tensor3 key = dump.read(l, DumpField::key), value = dump.read(l, DumpField::value);
    for (std::size_t h = 0; h < 2; ++h) {
      const HeadCache hc = cache.read_head(l, h);
      REQUIRE(hc.segments.size() == 2);  // warm and hot (no cold tier without a warm budget)
      CHECK(hc.segments[0].n_kept() == quantized);
      CHECK(cache.stored_bytes(l, h).total() == hc.bytes().total());
      total += hc.bytes().total();
      std::vector<float> k(n * d), v(n * d);
      reconstruct_head(hc, {}, k.data(), v.data());
      // Reference: the f16 rows, each old block quantized whole (keys per channel, values per token).
      std::vector<float> kr(n * d), vr(n * d);
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t c = 0; c < d; ++c) {
          kr[t * d + c] = f16(key.row(h, t)[c]);
          vr[t * d + c] = f16(value.row(h, t)[c]);
        }
      }
      for (std::size_t b = 0; b < quantized; b += 32) {
        dequantize_block_ref(quantize_block_ref(kr.data() + b * d, 32, d, QuantAxis::channel, 4, 32, QuantRule::bounded), kr.data() + b * d);
        dequantize_block_ref(quantize_block_ref(vr.data() + b * d, 32, d, QuantAxis::token, 2, 32, QuantRule::bounded), vr.data() + b * d);
      }
      INFO("layer " << l << " head " << h);
      CHECK(k == kr);
      CHECK(v == vr);
    }
  }
  CHECK(rep.total.total() == total);
}
