#include "akv/kv/tiered.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "akv/core/checked.h"
#include "akv/core/errors.h"
#include "akv/kv/stored_tensor.h"
#include "akv/score/score.h"
#include "akv/tensor/half.h"

namespace akv {
namespace {

enum class Tier : std::uint8_t { hot, warm, cold };

constexpr std::size_t kValueGroup = 32;  // channels per value group (per-token quantization)
// akv's own tiers quantize with the bounded rule: every value within scale / 2 of its input.
constexpr QuantRule kTierRule = QuantRule::bounded;

// One tier's keys and values of one head in the attention module's storage (PackedTensor),
// rows in chronological order, inserted and erased in the middle: quantized tiers hold whole
// blocks of B rows (keys per channel over the block, values per token in groups of 32
// channels), f16 tiers hold dense rows.
class TierRows {
 public:
  TierRows() = default;
  // bits 16: f16 rows.
  TierRows(std::size_t d, std::size_t block, int bits_k, int bits_v)
      : d_(d), b_(block), bk_(bits_k), bv_(bits_v), k_(d, DenseType::f16), v_(d, DenseType::f16) {}
  std::size_t rows() const { return k_.rows(); }

  // B rows (f32 keys and values [B, d]) before row `at`, quantized or rounded to f16.
  void insert_block(std::size_t at, const float* k, const float* v) {
    if (bk_ == 16) {
      std::vector<std::uint16_t> hk(b_ * d_), hv(b_ * d_);
      f32_to_f16(k, hk.data(), hk.size());
      f32_to_f16(v, hv.data(), hv.size());
      insert_f16(at, hk.data(), hv.data(), b_);
      return;
    }
    k_.insert_packed(at, quantize_block(k, b_, d_, QuantAxis::channel, bk_, b_, kTierRule));
    v_.insert_packed(at, quantize_block(v, b_, d_, QuantAxis::token, bv_, kValueGroup, kTierRule));
  }
  // n f16 rows (bits [n, d]) before row `at` (f16 tiers).
  void insert_f16(std::size_t at, const std::uint16_t* k, const std::uint16_t* v, std::size_t n) {
    k_.insert_dense_f16(at, k, n);
    v_.insert_dense_f16(at, v, n);
  }
  void erase(std::size_t at, std::size_t n) {
    if (bk_ == 16) {
      k_.erase_dense(at, n);
      v_.erase_dense(at, n);
    } else {
      k_.erase_packed(at, n);
      v_.erase_packed(at, n);
    }
  }
  // Rows [at, at + n) as f32 (dequantized, or f16 widened exactly): k, v [n, d].
  void read(std::size_t at, std::size_t n, float* k, float* v) const {
    dequantize_rows(k_.view(), d_, at, at + n, k);
    dequantize_rows(v_.view(), d_, at, at + n, v);
  }
  const std::uint16_t* key_f16(std::size_t row) const { return k_.dense_f16(row); }
  const std::uint16_t* value_f16(std::size_t row) const { return v_.dense_f16(row); }
  std::uint64_t bytes() const { return k_.bytes() + v_.bytes(); }
  HeadView view() const { return {k_.view(), v_.view()}; }
  // The rows as a cache-file segment's key and value.
  const PackedTensor& keys() const { return k_; }
  const PackedTensor& values() const { return v_; }

 private:
  std::size_t d_ = 0, b_ = 0;
  int bk_ = 16, bv_ = 16;
  PackedTensor k_, v_;
};

struct Block {
  std::size_t first = 0, rows = 0;  // positions [first, first + rows)
  Tier tier = Tier::hot;
};

class TieredHead {
 public:
  TieredHead(const TieredParams& t, std::size_t d)
      : t_(t), d_(d), hot_(d, t.block, 16, 16), warm_(d, t.block, t.warm_bits_key, t.warm_bits_value),
        cold_(d, t.block, t.cold_bits, t.cold_bits) {}

  // Appends rows (f32 post-RoPE keys, values [n, d]) at positions n_tokens().. to the hot tier.
  // The open block is always hot and the hot tier is the last view segment, so the rows and
  // their positions go at the end (no rebuild).
  void append(const float* k, const float* v, std::size_t n) {
    std::vector<std::uint16_t> hk(n * d_), hv(n * d_);
    f32_to_f16(k, hk.data(), n * d_);
    f32_to_f16(v, hv.data(), n * d_);
    hot_.insert_f16(hot_.rows(), hk.data(), hv.data(), n);
    for (std::size_t i = 0; i < n; ++i) {
      if (blocks_.empty() || blocks_.back().rows == t_.block) blocks_.push_back({tokens(), 0, Tier::hot});
      ++blocks_.back().rows;
      ++count_[0];
      position_.push_back(static_cast<std::int32_t>(tokens()));
      score_.push_back(0.0);
      attn_.push_back(0.0);
    }
  }
  std::size_t tokens() const { return score_.size(); }
  std::vector<double>& scores() { return score_; }

  void observe(const float* probs, double weight) {
    for (std::size_t r = 0; r < position_.size(); ++r) attn_[static_cast<std::size_t>(position_[r])] += weight * probs[r];
  }

  // Score update of one decode step (the newest position is tokens() - 1).
  void update_scores() {
    const std::size_t now = tokens() - 1;
    for (std::size_t i = 0; i < score_.size(); ++i) {
      score_[i] = t_.decay * score_[i] + t_.w_attn * attn_[i] + t_.w_recency / (1.0 + static_cast<double>(now - i));
      attn_[i] = 0.0;
    }
  }

  // Demotions while a tier is over budget, then (importance, `promote`) promotions; see tiered.h.
  void enforce(bool promote) {
    const bool over = count_[0] > t_.hot || (t_.warm && count_[1] > *t_.warm);
    if (!over && !(promote && t_.demotion == Demotion::importance && count_[1] + count_[2] > 0)) return;
    const bool importance = t_.demotion == Demotion::importance;
    bscore_.assign(blocks_.size(), 0.0);
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      for (std::size_t i = blocks_[b].first; i < blocks_[b].first + blocks_[b].rows; ++i) bscore_[b] += score_[i];
    }
    std::vector<bool> anchor(blocks_.size(), false);
    if (t_.anchors > 0) {
      std::vector<std::size_t> cand;
      for (std::size_t b = 0; b < blocks_.size(); ++b) {
        if (blocks_[b].tier == Tier::hot && !is_protected(b)) cand.push_back(b);
      }
      const std::size_t k = std::min(cand.size(), ceil_div(t_.anchors, t_.block));
      std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(),
                        [&](std::size_t a, std::size_t b) { return better(a, b); });
      for (std::size_t i = 0; i < k; ++i) anchor[cand[i]] = true;
    }
    auto pick = [&](Tier tier, bool lowest) {
      std::size_t best = blocks_.size();
      for (std::size_t b = 0; b < blocks_.size(); ++b) {
        if (blocks_[b].tier != tier || (tier == Tier::hot && (is_protected(b) || anchor[b]))) continue;
        if (best == blocks_.size()) {
          best = b;
        } else if (lowest) {
          if (importance && better(best, b)) best = b;  // fifo: the oldest (first found)
        } else if (better(b, best)) {
          best = b;
        }
      }
      return best;
    };
    while (count_[0] > t_.hot) {
      const std::size_t b = pick(Tier::hot, true);
      if (b == blocks_.size()) break;
      move(b, Tier::warm);
    }
    while (t_.warm && count_[1] > *t_.warm) {
      const std::size_t b = pick(Tier::warm, true);
      if (b == blocks_.size()) break;
      move(b, Tier::cold);
    }
    if (!importance || !promote) return;
    // Promotion: the best colder block against the weakest block above it, at most once per
    // `block` steps per tier boundary.
    const double up = 1.0 + t_.margin;
    const std::size_t now = tokens();
    if (now >= next_promotion_[1]) {
      const std::size_t best_cold = pick(Tier::cold, false), weak_warm = pick(Tier::warm, true);
      if (best_cold != blocks_.size() && weak_warm != blocks_.size() && bscore_[best_cold] > up * bscore_[weak_warm]) {
        move(weak_warm, Tier::cold);
        move(best_cold, Tier::warm);
        next_promotion_[1] = now + t_.block;
      }
    }
    if (now < next_promotion_[0]) return;
    // Hot never has room for a whole block beside a warm one: warm holds only blocks demoted
    // while hot held more than its budget, and every block but the open (protected) one is whole.
    const std::size_t best_warm = pick(Tier::warm, false), weak_hot = pick(Tier::hot, true);
    if (best_warm != blocks_.size() && weak_hot != blocks_.size() && bscore_[best_warm] > up * bscore_[weak_hot]) {
      move(weak_hot, Tier::warm);
      move(best_warm, Tier::hot);
      next_promotion_[0] = now + t_.block;
    }
  }

  KvView view() const {
    KvView v;
    v.segments[0] = warm_.view();
    v.segments[1] = cold_.view();
    v.segments[2] = hot_.view();
    v.position = position_.data();
    v.n = position_.size();
    return v;
  }

  TierBytes tier_bytes() const {
    TierBytes b;
    b.hot = hot_.bytes();
    b.warm = warm_.bytes();
    b.cold = cold_.bytes();
    for (const auto& [id, rows] : shadow_) b.cold += 2ull * (rows.first.size() + rows.second.size());
    b.hot_tokens = tier_tokens(Tier::hot);
    b.warm_tokens = tier_tokens(Tier::warm);
    b.cold_tokens = tier_tokens(Tier::cold);
    return b;
  }

  // The head as cache-file segments (warm, cold, hot; empty ones left out).
  HeadCache to_head_cache() const {
    HeadCache h;
    h.n_tokens = tokens();
    h.head_dim = d_;
    auto segment = [&](Tier t) {
      HeadCache s;
      s.n_tokens = tokens();
      s.head_dim = d_;
      for (const Block& b : blocks_) {
        for (std::size_t i = 0; b.tier == t && i < b.rows; ++i) s.kept.push_back(static_cast<std::int32_t>(b.first + i));
      }
      const std::size_t n = s.kept.size();
      if (s.kept.size() == tokens()) s.kept.clear();  // all tokens: no index needed
      const TierRows& rows = t == Tier::hot ? hot_ : t == Tier::warm ? warm_ : cold_;
      s.key = rows.keys();
      s.value = rows.values();
      if (n > 0) h.segments.push_back(std::move(s));
    };
    segment(Tier::warm);
    segment(Tier::cold);
    segment(Tier::hot);
    return h;
  }

 private:
  // a ranks above b: higher block score (bscore_, computed by enforce), ties to the newer block.
  bool better(std::size_t a, std::size_t b) const {
    return bscore_[a] != bscore_[b] ? bscore_[a] > bscore_[b] : a > b;
  }
  bool is_protected(std::size_t b) const {
    const Block& k = blocks_[b];
    const std::size_t n = tokens();
    return k.rows < t_.block || k.first < t_.protect_first || k.first + k.rows + t_.protect_last > n;
  }
  std::size_t tier_tokens(Tier t) const { return count_[static_cast<int>(t)]; }
  // The first row of block b in the storage of tier t (its chronological place there).
  std::size_t row_in(std::size_t b, Tier t) const {
    std::size_t r = 0;
    for (std::size_t i = 0; i < b; ++i) r += blocks_[i].tier == t ? blocks_[i].rows : 0;
    return r;
  }
  TierRows& rows_of(Tier t) { return t == Tier::hot ? hot_ : t == Tier::warm ? warm_ : cold_; }
  const TierRows& rows_of(Tier t) const { return t == Tier::hot ? hot_ : t == Tier::warm ? warm_ : cold_; }

  // Current values of block b as f32 [B, d] (exact f16 rows where the tier or host has them).
  void read(std::size_t b, std::vector<float>& k, std::vector<float>& v) const {
    const std::size_t n = t_.block * d_;
    k.resize(n);
    v.resize(n);
    const Block& blk = blocks_[b];
    if (auto it = shadow_.find(blk.first); blk.tier != Tier::hot && it != shadow_.end()) {
      f16_to_f32(it->second.first.data(), k.data(), n);
      f16_to_f32(it->second.second.data(), v.data(), n);
    } else {
      rows_of(blk.tier).read(row_in(b, blk.tier), t_.block, k.data(), v.data());
    }
  }

  void move(std::size_t b, Tier to) {
    std::vector<float> k, v;
    read(b, k, v);
    Block& blk = blocks_[b];
    const std::size_t n = t_.block * d_;
    const Tier from = blk.tier;
    const std::size_t r = row_in(b, from);
    // Leave the old tier.
    if (from == Tier::hot && t_.cold_bits == 16) {  // the host keeps the exact rows from now on
      shadow_[blk.first] = {std::vector<std::uint16_t>(hot_.key_f16(r), hot_.key_f16(r) + n),
                            std::vector<std::uint16_t>(hot_.value_f16(r), hot_.value_f16(r) + n)};
    }
    rows_of(from).erase(r, t_.block);
    count_[static_cast<int>(from)] -= blk.rows;
    count_[static_cast<int>(to)] += blk.rows;
    blk.tier = to;
    // Enter the new one, at its chronological place.
    const std::size_t at = row_in(b, to);
    if (to == Tier::cold && t_.cold_bits == 16) {
      const auto& s = shadow_.at(blk.first);
      cold_.insert_f16(at, s.first.data(), s.second.data(), t_.block);
      shadow_.erase(blk.first);
    } else {
      rows_of(to).insert_block(at, k.data(), v.data());
      if (to == Tier::hot) shadow_.erase(blk.first);
    }
    if (from == Tier::cold && to == Tier::warm && t_.cold_bits == 16) {
      std::vector<std::uint16_t> hk(n), hv(n);
      f32_to_f16(k.data(), hk.data(), n);
      f32_to_f16(v.data(), hv.data(), n);
      shadow_[blk.first] = {std::move(hk), std::move(hv)};
    }
    rebuild_positions();
  }

  void rebuild_positions() {
    position_.clear();
    for (Tier t : {Tier::warm, Tier::cold, Tier::hot}) {
      for (const Block& b : blocks_) {
        if (b.tier != t) continue;
        for (std::size_t i = 0; i < b.rows; ++i) position_.push_back(static_cast<std::int32_t>(b.first + i));
      }
    }
  }

  TieredParams t_;
  std::size_t d_;
  std::vector<Block> blocks_;
  TierRows hot_, warm_;
  TierRows cold_;  // f16 rows when cold_bits is 16
  // cold_bits 16: exact f16 rows (keys, values) of warm blocks, by first position (host).
  std::map<std::size_t, std::pair<std::vector<std::uint16_t>, std::vector<std::uint16_t>>> shadow_;
  std::vector<double> score_, attn_;  // per position
  std::vector<double> bscore_;        // per block, during enforce
  std::size_t count_[3] = {0, 0, 0};  // tokens per tier (hot, warm, cold)
  std::size_t next_promotion_[2] = {0, 0};  // token count from which warm->hot / cold->warm may promote
  std::vector<std::int32_t> position_;  // view order: warm, cold, hot
};

class TieredPolicy : public KvPolicy {
 public:
  TieredPolicy(const CompressParams& p, const KvGeometry& g) : t_(*p.tiered()), g_(g) {
    validate_tiered(t_, g.head_dim);
    for (std::size_t i = 0; i < g.n_layers * g.n_kv_heads; ++i) heads_.emplace_back(t_, g.head_dim);
  }

  void ingest_prompt(const PromptKv& prompt) override {
    const std::size_t n = prompt.n_tokens;
    const KvWindow m = g_.prompt_window(n, prompt.query[0].dim1());  // the last rows given
    ScoreOptions so;
    so.method = ScoreMethod::snapkv;
    so.window = std::min(kTieredPromptWindow, n);
    for (std::size_t l = 0; l < g_.n_layers; ++l) {
      for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
        TieredHead& th = heads_[l * g_.n_kv_heads + h];
        // Block by block so that demotion keeps the hot tier small while the prompt streams in.
        const HeadScores hs = score_head(prompt.query[l], prompt.key[l], h, m, so);
        for (std::size_t t0 = 0; t0 < n; t0 += t_.block) {
          const std::size_t c = std::min(t_.block, n - t0);
          th.append(prompt.key[l].row(h, t0), prompt.value[l].row(h, t0), c);
          for (std::size_t i = t0; i < t0 + c; ++i) th.scores()[i] = t_.w_attn * hs.mass[i];
          th.enforce(false);
        }
      }
    }
  }

  void append(std::size_t layer, const float* key, const float*, const float* value, std::size_t) override {
    // Budgets hold before this step's attention too (a block leaves hot as soon as it may, as
    // in KIVI); scores move at the end of the step.
    for (std::size_t h = 0; h < g_.n_kv_heads; ++h) {
      TieredHead& th = heads_[layer * g_.n_kv_heads + h];
      th.append(key + h * g_.head_dim, value + h * g_.head_dim, 1);
      th.enforce(false);
    }
  }
  KvView view(std::size_t layer, std::size_t kv_head) const override {
    return heads_[layer * g_.n_kv_heads + kv_head].view();
  }
  bool wants_probs() const override { return t_.w_attn != 0.0; }
  void observe(std::size_t layer, std::size_t kv_head, const float* probs) override {
    heads_[layer * g_.n_kv_heads + kv_head].observe(probs, static_cast<double>(g_.n_kv_heads) / static_cast<double>(g_.n_heads));
  }
  void end_step() override {
    for (TieredHead& h : heads_) {
      h.update_scores();
      h.enforce(true);
    }
  }
  std::uint64_t bytes() const override {
    const TierBytes b = *tier_bytes();
    return b.hot + b.warm + b.cold;
  }
  std::optional<TierBytes> tier_bytes() const override {
    TierBytes s;
    for (const TieredHead& h : heads_) {
      const TierBytes b = h.tier_bytes();
      s.hot += b.hot;
      s.warm += b.warm;
      s.cold += b.cold;
      s.hot_tokens += b.hot_tokens;
      s.warm_tokens += b.warm_tokens;
      s.cold_tokens += b.cold_tokens;
    }
    return s;
  }

 private:
  TieredParams t_;
  KvGeometry g_;
  std::vector<TieredHead> heads_;
};

}  // namespace

struct TieredStream::Impl {
  TieredHead head;
};

TieredStream::TieredStream(const TieredParams& t, std::size_t head_dim) {
  validate_tiered(t, head_dim);
  impl_ = std::make_unique<Impl>(Impl{TieredHead(t, head_dim)});
}
TieredStream::~TieredStream() = default;
void TieredStream::append(const float* key, const float* value) {
  impl_->head.append(key, value, 1);
  impl_->head.enforce(false);
}
KvView TieredStream::view() const { return impl_->head.view(); }
void TieredStream::observe(const float* probs, double weight) { impl_->head.observe(probs, weight); }
void TieredStream::end_step() {
  impl_->head.update_scores();
  impl_->head.enforce(true);
}
HeadCache TieredStream::to_head_cache() const { return impl_->head.to_head_cache(); }
TierBytes TieredStream::bytes() const { return impl_->head.tier_bytes(); }

std::unique_ptr<KvPolicy> make_tiered_policy(const CompressParams& params, const KvGeometry& g) {
  return std::make_unique<TieredPolicy>(params, g);
}

}  // namespace akv
