// Decode-time compression (every=N:target=T, kv/decode_compression.h): one layer's cut against
// brute-force references, and the runtime cache cutting every N decoded tokens.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/kv/decode_compression.h"
#include "akv/kv/runtime.h"
#include "akv/method/registry.h"
#include "akv/tensor/tensor.h"

using namespace akv;

namespace {

CompressParams params(const std::string& spec) { return resolve_params(parse_method_spec(spec)); }

// Rows of H heads with n rows each at increasing positions (gaps: a cache that evicted before).
struct Layer {
  std::size_t H, n, d;
  std::vector<std::vector<float>> key, value;
  std::vector<std::vector<std::int32_t>> position;
  std::vector<HeadRows> rows() const {
    std::vector<HeadRows> r;
    for (std::size_t h = 0; h < H; ++h) r.push_back({key[h].data(), value[h].data(), position[h].data(), n});
    return r;
  }
};

Layer random_layer(std::size_t H, std::size_t n, std::size_t d, std::uint64_t seed) {
  Rng r(seed);
  Layer l{H, n, d, {}, {}, {}};
  for (std::size_t h = 0; h < H; ++h) {
    std::vector<float> k(n * d), v(n * d);
    for (auto& x : k) x = static_cast<float>(r.normal());
    for (auto& x : v) x = static_cast<float>(r.normal());
    std::vector<std::int32_t> p(n);
    std::int32_t pos = 0;
    for (auto& x : p) {
      x = pos;
      pos += 1 + static_cast<std::int32_t>(r.uniform() * 3);
    }
    l.key.push_back(k);
    l.value.push_back(v);
    l.position.push_back(p);
  }
  return l;
}

KvShape shape(std::size_t n_heads, std::size_t H, std::size_t d) {
  KvShape s;
  s.n_layers = 1;
  s.n_heads = n_heads;
  s.n_kv_heads = H;
  s.head_dim = d;
  return s;
}

// Forced rows (sinks by position, the newest W) plus the `extra` best of the rest by `score`
// (higher first; ties: the older row), ascending.
std::vector<std::size_t> top_rows(const std::vector<double>& score, const std::vector<std::int32_t>& pos,
                                  std::size_t sinks, std::size_t W, std::size_t extra) {
  const std::size_t n = score.size();
  std::vector<std::size_t> keep, rest;
  for (std::size_t t = 0; t < n; ++t) (static_cast<std::size_t>(pos[t]) < sinks || t + W >= n ? keep : rest).push_back(t);
  std::stable_sort(rest.begin(), rest.end(), [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
  keep.insert(keep.end(), rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(std::min(extra, rest.size())));
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace

TEST_CASE("decode cut with knorm keeps the sinks, the window and the smallest keys", "[decode_compression]") {
  const Layer l = random_layer(3, 50, 8, 1);
  const EvictionParams e = *params("knorm:budget=0.5:sinks=2:window=3:every=4:target=20").eviction();
  REQUIRE(e.every == 4);
  std::vector<float> query(6 * 8, 0.5f);
  const auto keep = decode_cut(l.rows(), query.data(), 1, shape(6, 3, 8), e);
  for (std::size_t h = 0; h < 3; ++h) {
    std::vector<double> score(50);
    for (std::size_t t = 0; t < 50; ++t) {
      double s = 0;
      for (std::size_t c = 0; c < 8; ++c) s += static_cast<double>(l.key[h][t * 8 + c]) * l.key[h][t * 8 + c];
      score[t] = -std::sqrt(s);
    }
    INFO("head " << h);
    CHECK(keep[h] == top_rows(score, l.position[h], 2, 3, 20 - 2 - 3));
    CHECK(keep[h].size() == (l.position[h][1] < 2 ? 20u : 19u));  // one sink row when positions jump past 1
  }
}

TEST_CASE("decode cut with qfilter keeps the keys of largest projection on the layer's filters", "[decode_compression]") {
  const Layer l = random_layer(2, 40, 8, 4);
  const EvictionParams e = *params("qfilter:budget=0.5:qfilters=calib.json:sinks=1:window=2:every=4:target=12").eviction();
  std::vector<std::vector<double>> filters(2, std::vector<double>(8));
  for (std::size_t c = 0; c < 8; ++c) filters[0][c] = c % 2 ? 0.5 : -1.0, filters[1][c] = 0.25 * static_cast<double>(c) - 1.0;
  std::vector<float> query(4 * 8, 0.5f);
  const auto keep = decode_cut(l.rows(), query.data(), 1, shape(4, 2, 8), e, &filters);
  for (std::size_t h = 0; h < 2; ++h) {
    std::vector<double> score(40);
    for (std::size_t t = 0; t < 40; ++t) {
      double s = 0;
      for (std::size_t c = 0; c < 8; ++c) s += filters[h][c] * l.key[h][t * 8 + c];
      score[t] = -s;
    }
    INFO("head " << h);
    CHECK(keep[h] == top_rows(score, l.position[h], 1, 2, 12 - 1 - 2));
  }
  CHECK_THROWS_AS(decode_cut(l.rows(), query.data(), 1, shape(4, 2, 8), e), std::logic_error);  // no filters
}

TEST_CASE("decode cut with snapkv scores by the last decode queries' attention", "[decode_compression]") {
  const std::size_t H = 2, g = 2, d = 8, n = 40, W = 4;
  const Layer l = random_layer(H, n, d, 2);
  const EvictionParams e = *params("snapkv:budget=0.5:window=4:kernel=1:every=8:target=16").eviction();
  Rng r(3);
  std::vector<float> query(W * H * g * d);
  for (auto& x : query) x = static_cast<float>(r.normal());
  const auto keep = decode_cut(l.rows(), query.data(), W, shape(H * g, H, d), e);
  for (std::size_t h = 0; h < H; ++h) {
    // Window query i sits at row n - W + i: softmax over rows 0..n - W + i, mean over the
    // window's queries and the group's heads.
    std::vector<double> score(n, 0.0);
    for (std::size_t j = 0; j < g; ++j) {
      for (std::size_t i = 0; i < W; ++i) {
        const float* q = query.data() + (i * H * g + h * g + j) * d;
        const std::size_t last = n - W + i;
        std::vector<double> logit(last + 1);
        for (std::size_t t = 0; t <= last; ++t) {
          double s = 0;
          for (std::size_t c = 0; c < d; ++c) s += static_cast<double>(q[c]) * l.key[h][t * d + c];
          logit[t] = s / std::sqrt(static_cast<double>(d));
        }
        const double mx = *std::max_element(logit.begin(), logit.end());
        double z = 0;
        for (double x : logit) z += std::exp(x - mx);
        for (std::size_t t = 0; t <= last; ++t) score[t] += std::exp(logit[t] - mx) / z / static_cast<double>(W * g);
      }
    }
    INFO("head " << h);
    CHECK(keep[h] == top_rows(score, l.position[h], 0, W, 16 - W));
  }
  // Ada-KV spreads the layer's 2 x 12 selectable rows over the heads by score.
  const EvictionParams a = *params("adakv:budget=0.5:window=4:every=8:target=16").eviction();
  const auto ka = decode_cut(l.rows(), query.data(), W, shape(H * g, H, d), a);
  CHECK(ka[0].size() + ka[1].size() <= 2 * 16);
  CHECK(ka[0].size() >= W);
}

TEST_CASE("decode-time compression parameters", "[decode_compression]") {
  const CompressParams p = params("snapkv:budget=0.5:every=64:target=256");
  CHECK(p.eviction()->every == 64);
  CHECK(p.eviction()->target == 256);
  CHECK(describe(p).find("every 64 to 256") != std::string::npos);
  const EvictionParams back = EvictionParams::from_json(p.eviction()->to_json(), "f");
  CHECK(back.every == 64);
  CHECK(back.target == 256);
  CHECK(!params("snapkv:budget=0.5").eviction()->to_json().contains("every"));
  CHECK_THROWS_AS(params("snapkv:budget=0.5:every=64"), UsageError);
  CHECK_THROWS_AS(params("tova:budget=0.5:every=64:target=256"), UsageError);
  CHECK_THROWS_AS(params("pyramid:budget=0.5:every=64:target=256"), UsageError);
  CHECK_THROWS_AS(params("snapkv:budget=0.5:every=64:target=32"), InvalidInput);  // window 32
  CHECK_THROWS_AS(params("snapkv:budget=0.5:quant=kivi-4:every=64:target=256"), UsageError);
  CHECK_THROWS_AS(params("kivi-4:every=64:target=256"), UsageError);
  const KvGeometry g{{1, 2, 1, 8, 10000.0, RopeLayout::rotate_half, ""}, 64};
  CHECK_THROWS_AS(make_kv_policy(params("h2o:budget=0.5:window=4:every=8:target=16"), g), UsageError);
}

TEST_CASE("the runtime cache cuts every N decoded tokens back to the target", "[decode_compression]") {
  // A 1-layer cache fed a prompt and decoded tokens by hand.
  const std::size_t d = 8, H = 2, nh = 4;
  const KvGeometry g{{1, nh, H, d, 10000.0, RopeLayout::rotate_half, ""}, 256};
  auto cache = make_kv_policy(params("snapkv:budget=0.5:window=4:sinks=1:every=8:target=20"), g);
  REQUIRE(cache->wants_queries());
  REQUIRE(!cache->layer_local());
  Rng r(5);
  const std::size_t n = 48;
  std::vector<Tensor3> q(1, Tensor3(nh, n, d)), k(1, Tensor3(H, n, d)), v(1, Tensor3(H, n, d));
  for (auto* t : {&q[0], &k[0], &v[0]}) {
    for (std::size_t i = 0; i < t->size(); ++i) t->data()[i] = static_cast<float>(r.normal());
  }
  cache->ingest_prompt({&q, &k, &k, &v, n, nullptr});
  CHECK(cache->view(0, 0).n == 24);
  std::vector<float> kq(nh * d), kk(H * d), kv(H * d);
  for (std::size_t step = 1; step <= 20; ++step) {
    for (auto* x : {&kq, &kk, &kv}) {
      for (auto& y : *x) y = static_cast<float>(r.normal());
    }
    const std::size_t pos = n + step - 1;
    cache->append(0, kk.data(), kk.data(), kv.data(), pos);
    cache->take_query(0, pos, kq.data());
    cache->end_step();
    for (std::size_t h = 0; h < H; ++h) {
      const KvView view = cache->view(0, h);
      INFO("step " << step << " head " << h);
      // Cut after steps 8 and 16: 24 + 8 -> 20, then 20 + 8 -> 20; 4 more after step 16.
      CHECK(view.n == (step < 8 ? 24 + step : step < 16 ? 20 + step - 8 : 20 + step - 16));
      const std::vector<std::int32_t> p(view.position, view.position + view.n);
      CHECK(std::is_sorted(p.begin(), p.end()));
      CHECK(p.front() == 0);  // the sink
      for (std::size_t w = 0; w < 4; ++w) CHECK(p[p.size() - 1 - w] == static_cast<std::int32_t>(pos - w));
    }
    // The most it held: 24 + 8 rows per head just before the first cut (f16 keys and values, a
    // 4-byte position per row); before that, what it holds.
    CHECK(cache->peak_bytes() == 2 * (step < 8 ? 24 + step : 32) * (2 * d * 2 + 4));
  }
  CHECK(cache->bytes() == 2 * 24 * (2 * d * 2 + 4));  // f16 keys and values, a 4-byte position per row
}

TEST_CASE("threshold eviction while decoding keeps the sinks, the window and each token scored >= T",
          "[decode_compression]") {
  // knorm:threshold=-2.8: a token stays while -|k| >= -2.8 or it is a sink or one of the newest 4.
  const std::size_t d = 8, H = 2, nh = 4, n = 24, W = 4, sinks = 1;
  const double T = -2.8;
  const KvGeometry g{{1, nh, H, d, 10000.0, RopeLayout::rotate_half, ""}, 256};
  auto cache = make_kv_policy(params("knorm:threshold=-2.8:window=4:sinks=1:decoding=on"), g);
  REQUIRE(!cache->layer_local());
  REQUIRE(!cache->wants_inputs());  // knorm scores keys
  Rng r(11);
  std::vector<Tensor3> q(1, Tensor3(nh, W, d)), k(1, Tensor3(H, n, d)), v(1, Tensor3(H, n, d));
  for (auto* t : {&q[0], &k[0], &v[0]}) {
    for (std::size_t i = 0; i < t->size(); ++i) t->data()[i] = static_cast<float>(r.normal());
  }
  std::vector<std::vector<std::vector<float>>> keys(H);  // every token's key, per head
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t t = 0; t < n; ++t) keys[h].emplace_back(k[0].row(h, t), k[0].row(h, t) + d);
  }
  auto expected = [&](std::size_t h, std::size_t total) {
    std::vector<std::int32_t> out;
    for (std::size_t t = 0; t < total; ++t) {
      double s = 0;
      for (float x : keys[h][t]) s += static_cast<double>(x) * x;
      if (t < sinks || t + W >= total || -std::sqrt(s) >= T) out.push_back(static_cast<std::int32_t>(t));
    }
    return out;
  };
  cache->ingest_prompt({&q, &k, &k, &v, n, nullptr});
  std::size_t evicted_while_decoding = 0;
  std::vector<float> kk(H * d), kv(H * d);
  for (std::size_t step = 1; step <= 20; ++step) {
    for (auto* x : {&kk, &kv}) {
      for (auto& y : *x) y = static_cast<float>(r.normal());
    }
    const std::size_t pos = n + step - 1;
    for (std::size_t h = 0; h < H; ++h) keys[h].emplace_back(kk.begin() + static_cast<std::ptrdiff_t>(h * d), kk.begin() + static_cast<std::ptrdiff_t>((h + 1) * d));
    const std::uint64_t before = cache->bytes() + 2 * (2 * d * 2 + 4);  // this step's rows too
    cache->append(0, kk.data(), kk.data(), kv.data(), pos);
    cache->end_step();
    CHECK(cache->peak_bytes() >= before);
    for (std::size_t h = 0; h < H; ++h) {
      const KvView view = cache->view(0, h);
      INFO("step " << step << " head " << h);
      const std::vector<std::int32_t> got(view.position, view.position + view.n), want = expected(h, pos + 1);
      CHECK(got == want);
      evicted_while_decoding += pos + 1 - got.size();
    }
  }
  CHECK(evicted_while_decoding > 0);
}

TEST_CASE("threshold= and decoding= parameters: refusals and the file round trip", "[decode_compression]") {
  const EvictionParams e = *params("knorm:threshold=-2.5:window=8:decoding=on").eviction();
  REQUIRE(e.threshold);
  CHECK(*e.threshold == -2.5);
  CHECK(e.decoding);
  const EvictionParams back = EvictionParams::from_json(e.to_json(), "x.json");
  CHECK(back.threshold == e.threshold);
  CHECK(back.decoding);
  CHECK(!params("knorm:budget=0.5").eviction()->to_json().contains("threshold"));
  CHECK(!params("snapkv:threshold=0.01").eviction()->decoding);
  CHECK_THROWS_AS(params("knorm:threshold=-1:budget=0.5"), UsageError);        // a budget too
  CHECK_THROWS_AS(params("knorm:budget=0.5:decoding=on"), UsageError);         // no threshold
  CHECK_THROWS_AS(params("snapkv:threshold=0.01:decoding=on"), UsageError);    // scores with queries
  CHECK_THROWS_AS(params("knorm:threshold=-1:decoding=on:quant=kivi-4"), UsageError);
  CHECK_THROWS_AS(params("h2o:threshold=0.1"), UsageError);
  CHECK_THROWS_AS(params("adakv:threshold=0.1:alpha=0.5"), UsageError);      // the allocator's flag
  CHECK_THROWS_AS(params("knorm:threshold=-1:critical=on"), UsageError);
  CHECK_THROWS_AS(params("knorm:threshold=-1:decoding=on:every=8:target=32"), UsageError);
  CHECK_THROWS_AS(params("knorm:threshold=-1:every=8:target=32"), UsageError);
}
