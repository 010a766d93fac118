#pragma once
// A Llama-family decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP) in f32 with Eigen, with
// Gemma 2 and 3's differences (local sliding-window layers, sandwich norms, GeGLU, scaled embeddings,
// soft-capping).
// The prompt runs as one batched causal prefill at full precision; decode steps run one token
// per sequence, for one sequence or a batch of them, and read their K/V through a KvPolicy
// (kv/policy.h), so every cache method runs inside the model.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "akv/attention/decode_attention.h"
#include "akv/kv/policy.h"
#include "akv/model/weight.h"
#include "akv/tensor/kv_shape.h"
#include "akv/tensor/rope.h"
#include "akv/tensor/tensor.h"

namespace akv {

// The KV shape (the loader sets rope_layout: interleaved for llama2.c, rotate-half for HF) and
// the rest of the architecture.
struct ModelConfig : KvShape {
  std::string name;
  std::size_t dim = 0, hidden_dim = 0;
  std::size_t vocab_size = 0, seq_len = 0;
  float norm_eps = 1e-5f;
  bool qkv_bias = false;
  RopeScaling rope_scaling;    // Hugging Face rope_scaling (none for llama2.c)
  std::size_t rotary_dim = 0;  // dims of each head that RoPE rotates; 0 = head_dim
  std::string tokenizer;  // "bytes" when config.json says "akv_tokenizer": "bytes"
  // KvShape::layer_window: the prefill masks the windows; a run that needs it (windowed_run)
  // decodes through kv/windowed.h's cache, which keeps local layers to their window's rows.
  // RoPE base of the local layers, which rotate without rope_scaling (Gemma 3's
  // rope_local_base_freq); 0: every layer rotates with rope_theta and rope_scaling.
  double rope_theta_local = 0;
  // The attention logits' scale; 0: 1 / sqrt(head_dim). Gemma: query_pre_attn_scalar^-0.5, applied
  // to the queries after RoPE (as llama.cpp does), so the caches see the queries the logits use.
  float attn_scale = 0;
  // Gemma: the embeddings times sqrt(dim) (in f32, as llama.cpp; transformers rounds the factor to
  // the checkpoint's dtype). 1 otherwise.
  float embed_scale = 1;
  // The MLP's gate activation: SwiGLU (silu) or Gemma's GeGLU (gelu with the tanh approximation,
  // transformers' gelu_pytorch_tanh).
  enum class Activation { silu, gelu_tanh };
  Activation activation = Activation::silu;
  // Gemma 2/3's final logit soft-capping: logits = c * tanh(logits / c); 0: none.
  float final_softcap = 0;
  // Gemma 2's attention logit soft-capping of the scaled scores, s -> c * tanh(s / c); 0: none.
  float attn_softcap = 0;
};

// Weight matrices are [out, in] (y = W x), f32 or in their file's encoding (weight.h).
struct LayerWeights {
  std::vector<float> attn_norm;   // [dim]
  Weight wq, wk, wv, wo;          // [n_heads*hd, dim], [n_kv*hd, dim] x2, [dim, n_heads*hd]
  std::vector<float> bq, bk, bv;  // biases (qwen2) or empty
  // Qwen3: RMSNorm of every query and key head ([head_dim] weights) before RoPE, or empty.
  std::vector<float> q_norm, k_norm;
  std::vector<float> ffn_norm;    // [dim]
  Weight w1, w2, w3;              // [hidden, dim], [dim, hidden], [hidden, dim]
  // Gemma 2/3: RMSNorm of the attention output and of the MLP output before each joins the
  // residual stream ([dim]), or empty.
  std::vector<float> post_attn_norm, post_ffn_norm;
};

struct ModelWeights {
  Weight embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [dim]
  Weight classifier;              // [vocab, dim]; empty when tied to the embedding
  // Bytes the weights occupy as resident (encoded ones as stored).
  std::uint64_t bytes() const;
};

// Everything a prefill produced, per layer (what `akv dump` writes and policies ingest).
struct PrefillResult {
  RowMatrix logits;                          // [n, vocab] (only the last row when !all_logits)
  std::vector<Tensor3> query, key, key_pre_rope, value;  // [heads, n, hd] per layer (query: the last rows asked)
  // [layer][n]: the L2 norm of each row's attention input, the RMS-normed hidden state (KVzip+).
  std::vector<std::vector<double>> input_norm;
};

// Sees each layer's attention input during a prefill, the RMS-normed hidden state (what Hugging
// Face's self_attn receives; KVzap's surrogate reads it): rows first_row .. first_row +
// input.rows() - 1 of [n, dim], the blocks of a layer in order, layers in order.
using LayerInputFn = std::function<void(std::size_t layer, std::size_t first_row, const RowMatrix& input)>;

// Sees each layer's queries (the last query_rows positions' [n_heads, rows, hd]), keys after and
// before RoPE and values [n_kv_heads, n, hd] once the layer is done, layers in order; returns
// whether the prefill's result keeps them (false: that layer's query, key, key_pre_rope and value
// are empty tensors in the result), so a cache fed here lets the prefill drop each layer as soon
// as it is stored.
using LayerKvFn = std::function<bool(std::size_t layer, const Tensor3& query, const Tensor3& key,
                                     const Tensor3& key_pre_rope, const Tensor3& value)>;

// Rows of a prefill's layer computed together (a multiple of the flash attention's query tile).
inline constexpr std::size_t kPrefillBlock = 512;

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights);
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return w_; }

  // Causal full-precision forward of tokens at positions 0..n-1; products (blocks of weight
  // rows) and attention heads run on `threads` threads (results identical for any count).
  // `query_rows`: the queries of only the last query_rows positions are returned (every
  // position's when larger than n), so a caller that reads a window does not hold them all.
  // `on_input`, when set, is called with each layer's attention input, `on_layer` with each
  // layer's keys and values.
  PrefillResult prefill(const std::vector<std::int32_t>& tokens, bool all_logits, int threads = 1,
                        std::size_t query_rows = SIZE_MAX, const LayerInputFn& on_input = {},
                        const LayerKvFn& on_layer = {}) const;
  // One token at `pos`: appends its K/V to `cache`, attends through it, returns the logits
  // (decode_lanes of one lane of one token).
  std::vector<float> decode(std::int32_t token, std::size_t pos, KvPolicy& cache) const;
  // The batched decode step (eval/lanes.h drives it): lane i runs lanes[i].n tokens
  // at positions pos.. pos + n - 1 through its cache, layer by layer: each weight matrix is read
  // once for all rows of all lanes, and a lane's queries attend one after another (each after
  // its own token's append, so causally) while that layer's cache is still in the CPU's caches;
  // over a cache whose appends stay as they are (KvPolicy::appends_in_place: the chunked
  // protocol's) the lane's tokens are appended first and attend together, each to the rows up to
  // its own (attend_layer_block: every row read once for all of them).
  // Logits rows: lane 0's n rows, then lane 1's... Row j of lane i equals decode() of that token
  // after the lane's earlier tokens, bit for bit (attending together: up to the order of the
  // attention's sums), whatever lanes share the call and for any thread count. Weight products read each matrix once per call (linear.h's fixed order, rows
  // on `threads` threads); RoPE, cache updates and attention run per lane on the threads; a
  // buffer `logits` kept across calls saves its allocation. A lane with n > 1 needs a
  // cache whose layers are independent (KvPolicy::layer_local); bytes_after, when set, gets
  // each token's cache bytes after its append ([n], summed over layers: layer_bytes).
  struct Lane {
    KvPolicy* cache = nullptr;
    const std::int32_t* tokens = nullptr;
    std::size_t pos = 0, n = 1;
    std::uint64_t* bytes_after = nullptr;
  };
  void decode_lanes(const Lane* lanes, std::size_t n_lanes, RowMatrix& logits, int threads = 1,
                    AttentionMode attention = AttentionMode::exact) const;
  // Positions a run may use: the model's context (seq_len) unless set_position_limit changed it.
  // A limit past seq_len runs what the weights compute there (RoPE at positions the model was not
  // trained on), as llama.cpp does with a warning. Prefill and decode refuse positions past it
  // (InvalidInput).
  std::size_t position_limit() const { return limit_; }
  void set_position_limit(std::size_t n);
  // What the limit is, for errors: "the model's context (seq_len N)" or "the run's position
  // limit (N, --max-context)".
  std::string limit_text() const;
  // Checks every id of every sequence (prediction targets included) against the vocabulary;
  // InvalidInput names the file, the sequence and position (1-based) and the id.
  void check_tokens(const std::vector<std::vector<std::int32_t>>& sequences, const std::string& file) const;

 private:
  void check_token(std::int32_t t) const;
  // decode_lanes' steps: the lanes checked (caches, tokens, positions; bytes_after zeroed) and
  // each lane's first row (lane i's rows [row0[i], row0[i + 1])); the rows' embeddings into x and
  // their RoPE tables, one per row (dynamic scaling sees the row's own length; a model whose
  // local layers have their own base: one for those too); the logits checked finite.
  std::vector<std::size_t> lane_rows(const Lane* lanes, std::size_t n_lanes) const;
  void embed_lanes(const Lane* lanes, std::size_t n_lanes, RowMatrix& x, std::vector<RopeTable>& ropes,
                   std::vector<RopeTable>& ropes_local) const;
  void check_lane_logits(const RowMatrix& logits, const Lane* lanes, std::size_t n_lanes, int threads) const;
  // InvalidInput naming the model and `where` when x [n] holds NaN or Inf.
  void check_finite(const float* x, std::size_t n, const std::string& where) const;
  const Weight& classifier() const;
  ModelConfig config_;
  ModelWeights w_;
  std::size_t limit_ = 0;
};

}  // namespace akv
