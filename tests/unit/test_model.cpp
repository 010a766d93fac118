#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "akv/core/errors.h"
#include "akv/core/rng.h"
#include "akv/eval/perplexity.h"
#include "akv/io/token_file.h"
#include "akv/kv/runtime.h"
#include "akv/method/registry.h"
#include "akv/model/llama2c.h"
#include "akv/tensor/linear.h"
#include "random_model.h"
#include "test_util.h"

using namespace akv;
using test::have_shared;
using test::shared_dir;

namespace {

std::vector<std::vector<float>> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<float>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::vector<float> r;
    float v;
    while (s >> v) r.push_back(v);
    if (!r.empty()) rows.push_back(r);
  }
  return rows;
}

// A full-precision cache: stores every row as given.
class FullCache : public KvPolicy {
 public:
  FullCache(std::size_t layers, std::size_t kv_heads, std::size_t hd)
      : hd_(hd), kv_(kv_heads), k_(layers * kv_heads), v_(layers * kv_heads), pos_(layers * kv_heads) {}
  void ingest_prompt(const PromptKv&) override {}
  void append(std::size_t l, const float* k, const float*, const float* v, std::size_t pos) override {
    for (std::size_t h = 0; h < kv_; ++h) {
      auto i = l * kv_ + h;
      k_[i].insert(k_[i].end(), k + h * hd_, k + (h + 1) * hd_);
      v_[i].insert(v_[i].end(), v + h * hd_, v + (h + 1) * hd_);
      pos_[i].push_back(static_cast<std::int32_t>(pos));
    }
  }
  KvView view(std::size_t l, std::size_t h) const override {
    auto i = l * kv_ + h;
    return dense_kv_view(k_[i].data(), v_[i].data(), pos_[i].data(), pos_[i].size());
  }
  std::uint64_t bytes() const override { return 0; }

 private:
  std::size_t hd_, kv_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<std::int32_t>> pos_;
};

// For each sequence s, its first prompt[s] tokens prefilled and ingested by one cache per
// method (lane s * methods + m).
std::vector<std::unique_ptr<KvPolicy>> prefilled_lanes(const Model& m, const std::vector<std::vector<std::int32_t>>& lines,
                                                       const std::vector<std::size_t>& prompt,
                                                       const std::vector<std::optional<CompressParams>>& methods) {
  const KvGeometry g{m.config().kv_shape(), m.config().seq_len};
  std::vector<std::unique_ptr<KvPolicy>> caches;
  for (std::size_t s = 0; s < prompt.size(); ++s) {
    const std::vector<std::int32_t> p(lines[s].begin(), lines[s].begin() + static_cast<std::ptrdiff_t>(prompt[s]));
    const PrefillResult pre = m.prefill(p, false);
    for (const auto& method : methods) {
      caches.push_back(make_kv_policy(method, g, 1));
      caches.back()->ingest_prompt({&pre.query, &pre.key, &pre.key_pre_rope, &pre.value, prompt[s]});
    }
  }
  return caches;
}

}  // namespace

TEST_CASE("stories260K: prefill and decode logits match llama2.c", "[model]") {
  if (!have_shared()) {
    WARN("skipped: " << shared_dir() << "/models/stories260K.bin not found (set AKV_SHARED_DIR)");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  CHECK(m.config().dim == 64);
  CHECK(m.config().n_kv_heads == 4);
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  REQUIRE(lines.size() == 64);
  const auto ref = read_rows(shared_dir() + "/data/stories260K-logits-seq0-64.txt");
  REQUIRE(ref.size() == 64);
  std::vector<std::int32_t> seq(lines[0].begin(), lines[0].begin() + 64);
  const PrefillResult pre = m.prefill(seq, true);
  CHECK(m.prefill(seq, true, 3).logits == pre.logits);  // threads over heads: same bits
  {  // query_rows: only the last rows' queries, the same values; everything else unchanged
    const PrefillResult tail = m.prefill(seq, true, 1, 5);
    CHECK(tail.logits == pre.logits);
    REQUIRE(tail.query.size() == pre.query.size());
    for (std::size_t l = 0; l < pre.query.size(); ++l) {
      REQUIRE(tail.query[l].dim1() == 5);
      CHECK(tail.key[l].dim1() == 64);
      for (std::size_t h = 0; h < pre.query[l].dim0(); ++h) {
        CHECK(std::equal(tail.query[l].row(h, 0), tail.query[l].row(h, 0) + 5 * pre.query[l].dim2(), pre.query[l].row(h, 59)));
      }
    }
    CHECK(m.prefill(seq, false, 1, 1000).query[0].dim1() == 64);
  }
  FullCache cache(5, 4, 8);
  double max_prefill = 0, max_decode = 0;
  for (std::size_t p = 0; p < 64; ++p) {
    const std::vector<float> dec = m.decode(seq[p], p, cache);
    for (std::size_t j = 0; j < 512; ++j) {
      max_prefill = std::max(max_prefill, std::fabs(static_cast<double>(pre.logits(static_cast<Eigen::Index>(p), static_cast<Eigen::Index>(j))) - ref[p][j]));
      max_decode = std::max(max_decode, std::fabs(static_cast<double>(dec[j]) - ref[p][j]));
    }
  }
  INFO("max abs diff prefill " << max_prefill << " decode " << max_decode);
  CHECK(max_prefill <= 1e-4);
  CHECK(max_decode <= 1e-4);
}

TEST_CASE("prefill over several row blocks: decode's logits and K/V, the window's queries across a block edge, "
          "the attention inputs block by block", "[model]") {
  const ModelConfig c = test::small_config(2, 16, 40, 2048);
  const Model m = test::random_model(c, 23, 0.3);
  const std::size_t n = 2 * kPrefillBlock + 76;  // two whole blocks and a part (not a whole tile)
  Rng r(5);
  std::vector<std::int32_t> seq(n);
  for (auto& t : seq) t = static_cast<std::int32_t>(r.below(c.vocab_size));
  std::vector<std::pair<std::size_t, std::size_t>> blocks;  // (layer, first row) as the hook saw them
  std::vector<RowMatrix> inputs(c.n_layers, RowMatrix(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(c.dim)));
  const PrefillResult pre = m.prefill(seq, true, 2, 600, [&](std::size_t l, std::size_t first, const RowMatrix& x) {
    blocks.emplace_back(l, first);
    inputs[l].middleRows(static_cast<Eigen::Index>(first), x.rows()) = x;
  });
  CHECK(blocks == std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {0, 512}, {0, 1024}, {1, 0}, {1, 512}, {1, 1024}});
  const PrefillResult all = m.prefill(seq, true, 1);
  CHECK(all.logits == pre.logits);  // threads and query rows change no bits
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    REQUIRE(pre.query[l].dim1() == 600);
    for (std::size_t h = 0; h < c.n_heads; ++h) {
      CHECK(std::equal(pre.query[l].row(h, 0), pre.query[l].row(h, 0) + 600 * c.head_dim, all.query[l].row(h, n - 600)));
    }
    for (std::size_t i = 0; i < n; ++i) {  // the hook's rows have the norms the prefill reports
      CHECK(static_cast<double>(inputs[l].row(static_cast<Eigen::Index>(i)).cast<double>().norm()) ==
            Approx(pre.input_norm[l][i]).epsilon(1e-12));
    }
  }
  // Decode one token at a time through an f32 cache: other attention arithmetic, the same model.
  FullCache cache(c.n_layers, c.n_kv_heads, c.head_dim);
  double worst = 0, scale = 0;
  for (std::size_t p = 0; p < n; ++p) {
    const std::vector<float> dec = m.decode(seq[p], p, cache);
    for (std::size_t j = 0; j < c.vocab_size; ++j) {
      const double want = pre.logits(static_cast<Eigen::Index>(p), static_cast<Eigen::Index>(j));
      worst = std::max(worst, std::fabs(static_cast<double>(dec[j]) - want));
      scale = std::max(scale, std::fabs(want));
    }
  }
  INFO("largest |logit difference| " << worst << " of logits up to " << scale);
  CHECK(worst <= 1e-4 * scale);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const KvView v = cache.view(l, 1);
    REQUIRE(v.n == n);
    double kd = 0;
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t d = 0; d < c.head_dim; ++d) {
        kd = std::max(kd, std::fabs(static_cast<double>(static_cast<const float*>(v.segments[0].key.dense.data)[t * c.head_dim + d]) -
                                    pre.key[l].row(1, t)[d]));
      }
    }
    CHECK(kd <= 1e-4);
  }
}

TEST_CASE("caches that take the prompt a layer at a time during the prefill equal ingest_prompt's; the "
          "prefill then keeps no layer", "[model]") {
  const ModelConfig c = test::small_config(3, 32, 40, 1024);
  const Model m = test::random_model(c, 29, 0.3);
  Rng r(8);
  std::vector<std::int32_t> seq(700);
  for (auto& t : seq) t = static_cast<std::int32_t>(r.below(c.vocab_size));
  const std::vector<std::int32_t> prompt(seq.begin(), seq.begin() + 600);
  const KvGeometry g{c.kv_shape(), seq.size()};
  const PrefillResult whole = m.prefill(prompt, false);
  // Eviction whose allocator splits each layer's budget alone (or a threshold) plans each layer as
  // it comes, from the last queries it reads; adakv-global stores each layer whole and cuts after
  // the last; with quantized rows or h2o's state it, and CriticalKV, plan the whole prompt.
  for (const char* spec : {"full", "kivi-2", "kivi-4:rotate=hadamard", "k4v2:pre-rope", "ggml:k=q4_0:v=q8_0",
                           "fp8:scale=tensor", "snapkv:budget=0.5", "adakv:budget=0.3:quant=k4v2", "pyramid:budget=0.4",
                           "h2o:budget=0.5", "expected-attention:budget=0.5", "tova:budget=0.5", "knorm:budget=0.5",
                           "adakv-global:budget=0.5", "adakv-global:budget=0.5:score=h2o", "snapkv:budget=0.5:critical=on",
                           "adakv-global:budget=0.5:quant=kivi-4", "snapkv:threshold=0.002"}) {
    INFO(spec);
    const std::optional<CompressParams> p = resolve_method_spec(spec);
    auto a = make_kv_policy(p, g, 1), b = make_kv_policy(p, g, 1);
    a->ingest_prompt({&whole.query, &whole.key, &whole.key_pre_rope, &whole.value, prompt.size(), nullptr,
                      [&m](std::size_t l, RowMatrix& wo) { wo = m.weights().layers[l].wo.to_f32(); }});
    if (!b->takes_prompt_layers()) {  // quantized rows or h2o under an allocator over every layer, CriticalKV's W_o
      CHECK(((std::string(spec).rfind("adakv-global", 0) == 0 && std::string(spec) != "adakv-global:budget=0.5") ||
             std::string(spec).find("critical") != std::string::npos));
      CHECK_THROWS_AS(b->ingest_prompt_layer(0, {&whole.key[0], &whole.key_pre_rope[0], &whole.value[0], &whole.query[0]}),
                      std::logic_error);
      continue;
    }
    const std::size_t rows = prompt_query_rows(p, prompt.size());
    const bool every = std::string(spec).rfind("h2o", 0) == 0 || std::string(spec).rfind("expected", 0) == 0;
    CHECK(rows == (!p || !p->eviction() ? 0 : every ? 600 : std::max<std::size_t>(p->eviction()->score.window, 1)));
    std::size_t fed = 0;
    const PrefillResult streamed =
        m.prefill(prompt, false, 1, rows, {}, [&](std::size_t l, const Tensor3& q, const Tensor3& k, const Tensor3& kp, const Tensor3& v) {
          CHECK(l == fed++);
          CHECK(q.dim1() == rows);
          b->ingest_prompt_layer(l, {&k, &kp, &v, &q});
          return false;
        });
    CHECK(fed == c.n_layers);
    CHECK(streamed.logits == whole.logits);
    CHECK(streamed.key[1].size() == 0);
    CHECK(streamed.query[1].size() == 0);
    CHECK(a->bytes() == b->bytes());
    for (std::size_t l = 0; l < c.n_layers; ++l) {
      for (std::size_t h = 0; h < c.n_kv_heads; ++h) {
        const KvView x = a->view(l, h), y = b->view(l, h);
        REQUIRE(x.n == y.n);
        CHECK(std::equal(x.position, x.position + x.n, y.position));
        CHECK((x.n < prompt.size()) == (p && p->eviction()));
      }
    }
    for (std::size_t pos = prompt.size(); pos < seq.size(); ++pos) {
      const std::vector<float> x = m.decode(seq[pos], pos, *a), y = m.decode(seq[pos], pos, *b);
      REQUIRE(x == y);
    }
  }
}

TEST_CASE("position limit: the trained context by default, moved by set_position_limit", "[model]") {
  if (!have_shared()) return;
  Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  REQUIRE(m.config().seq_len == 512);
  CHECK(m.position_limit() == 512);
  const std::vector<std::int32_t> tokens(530, 5);
  CHECK_THROWS_WITH(m.prefill(tokens, false), Catch::Contains("the model's context (seq_len 512)"));
  m.set_position_limit(600);  // past the trained context: RoPE goes on, as llama.cpp's
  const PrefillResult pre = m.prefill(tokens, false);
  CHECK(pre.logits.allFinite());
  FullCache cache(5, 4, 8);
  for (std::size_t p = 0; p < 530; ++p) m.decode(tokens[p], p, cache);
  m.set_position_limit(520);
  CHECK_THROWS_WITH(m.prefill(tokens, false), Catch::Contains("position limit (520, --max-context)"));
  FullCache again(5, 4, 8);
  for (std::size_t p = 0; p < 520; ++p) m.decode(tokens[p], p, again);
  CHECK_THROWS_WITH(m.decode(5, 520, again), Catch::Contains("pos = 520"));
}

TEST_CASE("stories260K: full-cache perplexity over the 64 samples is 15.8769", "[model]") {
  if (!have_shared()) {
    WARN("skipped: shared data not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  double nll = 0;
  std::size_t count = 0;
  for (const auto& seq : lines) {
    const PrefillResult r = m.prefill(seq, true);
    for (std::size_t p = 0; p + 1 < seq.size(); ++p) {
      const auto row = r.logits.row(static_cast<Eigen::Index>(p)).cast<double>();
      const double mx = row.maxCoeff();
      const double lse = mx + std::log((row.array() - mx).exp().sum());
      nll += lse - row(seq[p + 1]);
      ++count;
    }
  }
  CHECK(count == 32704);
  CHECK(nll / count == Approx(2.764864).epsilon(1e-5));
  CHECK(std::exp(nll / count) == Approx(15.8769).epsilon(1e-4));
}

TEST_CASE("decode_lanes of one token each: every row equals decode() of its sequence, for any batch and thread count", "[model][batch]") {
  if (!have_shared()) {
    WARN("skipped: shared data not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  // Three sequences at different positions, through a full and a kivi-2 cache each (6 lanes;
  // a 32-token window, so that the kivi-2 lanes hold quantized rows).
  const std::vector<std::size_t> prompt = {40, 17, 63};
  const std::vector<std::optional<CompressParams>> methods = {std::nullopt,
                                                              resolve_params(parse_method_spec("kivi-2:residual=32"))};
  auto lanes = [&] { return prefilled_lanes(m, lines, prompt, methods); };
  auto one = lanes(), batched = lanes(), threaded = lanes();
  for (std::size_t step = 0; step < 5; ++step) {
    std::vector<std::int32_t> tokens;
    std::vector<std::size_t> pos;
    for (std::size_t lane = 0; lane < one.size(); ++lane) {
      const std::size_t s = lane / methods.size();
      pos.push_back(prompt[s] + step);
      tokens.push_back(lines[s][pos.back()]);
    }
    std::vector<Model::Lane> b_lanes, t_lanes;
    for (std::size_t lane = 0; lane < one.size(); ++lane) {
      b_lanes.push_back({batched[lane].get(), &tokens[lane], pos[lane], 1, nullptr});
      t_lanes.push_back({threaded[lane].get(), &tokens[lane], pos[lane], 1, nullptr});
    }
    RowMatrix b, t;
    m.decode_lanes(b_lanes.data(), b_lanes.size(), b, 1);
    m.decode_lanes(t_lanes.data(), t_lanes.size(), t, 2);
    for (std::size_t lane = 0; lane < one.size(); ++lane) {
      const std::vector<float> ref = m.decode(tokens[lane], pos[lane], *one[lane]);
      const auto r = static_cast<Eigen::Index>(lane);
      CHECK(std::equal(ref.begin(), ref.end(), b.row(r).data()));
      CHECK(std::equal(ref.begin(), ref.end(), t.row(r).data()));
    }
  }
  // The kivi-2 lanes differ from the full ones (the test compares different things).
  CHECK(one[0]->bytes() != one[1]->bytes());
  CHECK(one[1]->view(0, 0).segments[0].value.packed.rows > 0);
}

TEST_CASE("decode_lanes: several known tokens per lane equal decode() one at a time", "[model][batch]") {
  if (!have_shared()) {
    WARN("skipped: shared data not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  const auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  const KvGeometry g{m.config().kv_shape(), m.config().seq_len};
  // Two sequences through full, kivi-2 with a 32-token window (keys quantize a group of 32 at
  // a time, inside the calls; values one token at a time) and one-shot eviction caches; calls
  // of 1, 7 and 40 tokens per lane, then 2 and 3 mixed.
  const std::vector<std::size_t> prompt = {40, 17};
  const std::vector<std::optional<CompressParams>> methods = {std::nullopt,
                                                              resolve_params(parse_method_spec("kivi-2:residual=32")),
                                                              resolve_params(parse_method_spec("snapkv:budget=0.5:window=8"))};
  auto lanes = [&] { return prefilled_lanes(m, lines, prompt, methods); };
  auto one = lanes(), blocked = lanes();
  for (const auto& cache : blocked) REQUIRE(cache->layer_local());
  std::vector<std::size_t> done(one.size(), 0);
  const std::vector<std::vector<std::size_t>> calls = {{1, 1, 1, 1, 1, 1}, {7, 7, 7, 7, 7, 7}, {40, 40, 40, 40, 40, 40},
                                                       {2, 3, 2, 3, 2, 3}};
  for (const auto& counts : calls) {
    std::vector<Model::Lane> ls;
    std::vector<std::vector<std::uint64_t>> bytes(one.size());
    for (std::size_t lane = 0; lane < one.size(); ++lane) {
      const std::size_t s = lane / methods.size(), pos = prompt[s] + done[lane];
      bytes[lane].resize(counts[lane]);
      ls.push_back({blocked[lane].get(), lines[s].data() + pos, pos, counts[lane], bytes[lane].data()});
    }
    RowMatrix logits;
    m.decode_lanes(ls.data(), ls.size(), logits, 2);
    Eigen::Index row = 0;
    for (std::size_t lane = 0; lane < one.size(); ++lane) {
      const std::size_t s = lane / methods.size();
      for (std::size_t j = 0; j < counts[lane]; ++j, ++row) {
        const std::size_t pos = prompt[s] + done[lane] + j;
        const std::vector<float> ref = m.decode(lines[s][pos], pos, *one[lane]);
        CHECK(std::equal(ref.begin(), ref.end(), logits.row(row).data()));
        CHECK(bytes[lane][j] == one[lane]->bytes());
      }
      done[lane] += counts[lane];
      CHECK(blocked[lane]->bytes() == one[lane]->bytes());
    }
  }
  CHECK(one[0]->bytes() != one[1]->bytes());
  CHECK(one[1]->view(0, 0).segments[0].key.packed.rows >= 64);  // key groups quantized during the calls
  // Streaming eviction acts after every step: one token per call only.
  auto h2o = make_kv_policy(resolve_params(parse_method_spec("h2o:budget=0.5")), g, 1);
  CHECK_FALSE(h2o->layer_local());
  Model::Lane lane{h2o.get(), lines[0].data(), 0, 2, nullptr};
  RowMatrix logits;
  CHECK_THROWS_AS(m.decode_lanes(&lane, 1, logits), std::logic_error);
}

TEST_CASE("evaluate_perplexity: the same sums for any --batch and thread count", "[model][batch]") {
  if (!have_shared()) {
    WARN("skipped: shared data not found");
    return;
  }
  const Model m = load_llama2c(shared_dir() + "/models/stories260K.bin");
  auto lines = read_token_file(shared_dir() + "/data/stories260K-samples.txt");
  lines.resize(3);
  lines[1].resize(200);  // sequences of different lengths leave the batch at different steps
  PplOptions o;
  o.methods = {{"kivi-2", resolve_params(parse_method_spec("kivi-2"))},
               {"adakv", resolve_params(parse_method_spec("adakv:budget=0.5:window=16"))}};
  o.batch = 1;
  o.threads = 1;
  o.token_block = 1;  // one step per call: the reference
  const nlohmann::json ref = evaluate_perplexity(m, lines, o, nullptr).to_json();
  struct Run {
    std::size_t batch;
    int threads;
    std::size_t block;
  };
  for (const Run run : {Run{2, 1, 0}, Run{0, 2, 5}, Run{kBatchAuto, 2, 0}, Run{kBatchAuto, 1, 5}, Run{2, 2, 1}}) {
    o.batch = run.batch;
    o.threads = run.threads;
    o.token_block = run.block;
    CHECK(evaluate_perplexity(m, lines, o, nullptr).to_json() == ref);
  }
  CHECK(ref["methods"][1]["kl"].get<double>() > 0.0);
  // With a streaming method every lane decodes one token per call, whatever --token-block.
  o.methods.push_back({"h2o", resolve_params(parse_method_spec("h2o:budget=0.5"))});
  o.batch = 1;
  o.token_block = 1;
  const nlohmann::json ref_h2o = evaluate_perplexity(m, lines, o, nullptr).to_json();
  o.batch = kBatchAuto;
  o.token_block = 0;
  o.threads = 2;
  CHECK(evaluate_perplexity(m, lines, o, nullptr).to_json() == ref_h2o);
}

TEST_CASE("--token-block: auto aims at 256 rows a call, 1 to 16 tokens, logits within 256 MiB", "[model][batch]") {
  CHECK(resolve_token_block(0, 34, 32000) == 8);       // ceil(256 / 34)
  CHECK(resolve_token_block(0, 2, 32000) == 16);       // at most 16
  CHECK(resolve_token_block(0, 300, 32000) == 1);      // at least 1
  CHECK(resolve_token_block(0, 8, 1000000) == 8);      // 8 x 8 rows x 4 MB = 256 MB: at the limit
  CHECK(resolve_token_block(0, 8, 1100000) == 7);      // 8 would pass 256 MiB
  CHECK(resolve_token_block(0, 1000, 128256) == 1);    // never below 1
  CHECK(resolve_token_block(7, 1000, 128256) == 7);    // a given count is kept
}

TEST_CASE("--batch: auto keeps the lanes' f32 K/V within 2 GiB; counts and 0 = all", "[model][batch]") {
  KvShape s;
  s.n_layers = 32;
  s.n_kv_heads = 8;
  s.head_dim = 128;
  // An 8B-shaped cache: 2 x 4 x 32 x 8 x 128 bytes per token = 256 KiB; 4096 tokens = 1 GiB a lane.
  CHECK(resolve_batch(kBatchAuto, 100, 2, s, 4096) == 1);
  CHECK(resolve_batch(kBatchAuto, 100, 1, s, 2048) == 4);   // 512 MiB a sequence
  CHECK(resolve_batch(kBatchAuto, 100, 2, s, 512) == 8);    // 2 x 128 MiB
  CHECK(resolve_batch(kBatchAuto, 3, 2, s, 512) == 3);      // never more than the sequences
  CHECK(resolve_batch(0, 17, 2, s, 4096) == 17);
  CHECK(resolve_batch(5, 17, 2, s, 4096) == 5);
  CHECK(resolve_batch(50, 17, 2, s, 4096) == 17);
  CHECK(parse_batch("auto") == kBatchAuto);
  CHECK(parse_batch("0") == 0);
  CHECK(parse_batch("12") == 12);
  for (const char* bad : {"", "-1", "1.5", "x", "12 "}) CHECK_THROWS_AS(parse_batch(bad), InvalidInput);
  CHECK(parse_token_block("auto") == 0);
  CHECK(parse_token_block("0") == 0);
  CHECK(parse_token_block("7") == 7);
  CHECK(parse_token_block("1048576") == kTokenBlockFlagMax);
  for (const char* bad : {"", "-1", "+3", "1.5", "x", "7 ", "1048577"}) CHECK_THROWS_AS(parse_token_block(bad), InvalidInput);
}

TEST_CASE("llama2.c loader and token files: bad input", "[model][bad]") {
  test::TempDir dir;
  CHECK_THROWS_AS(load_llama2c(dir.file("missing.bin")), IoError);
  {
    std::ofstream f(dir.file("short.bin"), std::ios::binary);
    f << "abc";
  }
  CHECK_THROWS_AS(load_llama2c(dir.file("short.bin")), CorruptData);
  {
    std::ofstream f(dir.file("hdr.bin"), std::ios::binary);
    const std::int32_t h[7] = {64, 172, 5, 8, 4, 512, 512};
    f.write(reinterpret_cast<const char*>(h), sizeof h);
  }
  CHECK_THROWS_AS(load_llama2c(dir.file("hdr.bin")), CorruptData);  // truncated weights
  {
    std::ofstream f(dir.file("bad.bin"), std::ios::binary);
    const std::int32_t h[7] = {64, 172, 5, 7, 4, 512, 512};  // 7 heads do not divide dim 64
    f.write(reinterpret_cast<const char*>(h), sizeof h);
  }
  CHECK_THROWS_AS(load_llama2c(dir.file("bad.bin")), InvalidInput);
  {
    std::ofstream f(dir.file("t.txt"));
    f << "1 2 3\n\n4,5\n";
  }
  const auto t = read_token_file(dir.file("t.txt"));
  REQUIRE(t.size() == 2);
  CHECK(t[1] == std::vector<std::int32_t>{4, 5});
  {
    std::ofstream f(dir.file("bad.txt"));
    f << "1 2 x3\n";
  }
  CHECK_THROWS_AS(read_token_file(dir.file("bad.txt")), InvalidInput);
}

TEST_CASE("Weight::times_transpose: an X of more than one 16 MB slice equals the reference, bit for bit",
          "[model][linear]") {
  // 1100 vectors of 4100 values (18 MB): two slices of X, each laid out once for every block of
  // W's rows; 4100 % 8 = 4 leaves a tail per output.
  const std::size_t rows = 70, cols = 4100, batch = 1100;
  Rng rng(17);
  RowMatrix w(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  RowMatrix x(static_cast<Eigen::Index>(batch), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(rng.normal());
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(rng.normal());
  const Weight weight(w);
  const RowMatrix y = weight.times_transpose(x, 2);
  RowMatrix ref(static_cast<Eigen::Index>(batch), static_cast<Eigen::Index>(rows));
  linear_rows_ref(w.data(), rows, cols, cols, x.data(), batch, cols, ref.data(), rows);
  CHECK(y == ref);
}
