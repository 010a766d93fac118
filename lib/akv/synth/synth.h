#pragma once
// Synthetic dumps with the structure of real LLM caches (see docs/synth.md):
// - pre-RoPE keys with a few large-magnitude outlier channels in low-frequency RoPE pairs,
//   then RoPE; values without channel outliers;
// - heads of distinct kinds, recorded in /layers/L/head_kind. Attention patterns arise from the
//   stored queries and keys (q.k), never from stored attention:
//     local      attention on the sink tokens plus a recent window (RoPE's relative decay of a
//                query/key component shared by the head),
//     retrieval  attention on a few far-away needle tokens (listed in /needles),
//     diffuse    nearly uniform attention with a weak sink,
//     gaussian   unstructured i.i.d. normal keys, values and queries (profile "gaussian");
// - GQA: the query heads of one KV group share its kind, each with its own parameters;
// - deterministic for a seed on any machine and thread count: every (layer, KV head) has its own
//   random stream.
#include <cstdint>
#include <string>
#include <vector>

#include "akv/core/progress.h"
#include "akv/io/dump.h"

namespace akv {

enum class SynthProfile { mixed, local, retrieval, diffuse, gaussian };
enum class HeadKind { local, retrieval, diffuse, gaussian };

SynthProfile parse_synth_profile(const std::string& s);  // throws InvalidInput naming the value
std::string head_kind_name(HeadKind k);

// The KV shape (default 4 layers, 8 query / 2 KV heads, head_dim 64, rotate-half RoPE with
// theta 10000) and what else a synthetic dump is made of.
struct SynthOptions : KvShape {
  SynthOptions() {
    n_layers = 4;
    n_heads = 8;
    n_kv_heads = 2;
    head_dim = 64;
  }
  std::string model = "synth";
  std::size_t n_tokens = 1024;
  std::size_t window = 32;  // n_query: queries of the last `window` positions are stored
  std::uint64_t seed = 0;
  SynthProfile profile = SynthProfile::mixed;
  std::size_t sinks = 4;            // attention-sink tokens at the start
  std::size_t needles = 8;          // needle tokens (retrieval targets)
  std::size_t outlier_channels = 0; // key outlier channels per head; 0 = max(1, head_dim / 32)
  DumpWriteOptions write;           // dtype, gzip, key_pre_rope
  int threads = 0;                  // 0 = all hardware threads

  // Throws UsageError naming the flag of the first invalid option.
  void validate() const;
};

// Layout decided before any tensor: head kinds per layer and needle positions.
struct SynthPlan {
  std::vector<std::vector<HeadKind>> kinds;  // [n_layers][n_kv_heads]
  std::vector<std::int32_t> needles;         // sorted token positions
};
SynthPlan make_synth_plan(const SynthOptions& o);

// The tensors of one KV head of one layer.
struct SynthHead {
  Tensor3 key;           // [1, n_tokens, head_dim], after RoPE
  Tensor3 key_pre_rope;  // [1, n_tokens, head_dim]
  Tensor3 value;         // [1, n_tokens, head_dim]
  Tensor3 query;         // [group_size, window, head_dim], after RoPE
};
// `rope` covers positions [0, n_tokens).
SynthHead synth_kv_head(const SynthOptions& o, const SynthPlan& plan, std::size_t layer,
                        std::size_t kv_head, const RopeTable& rope);

struct SynthSummary {
  SynthPlan plan;
  std::uint64_t bytes_on_disk = 0;
  std::uint64_t elements = 0;  // key + value (+ key_pre_rope) + query elements written
};

// Generates and writes a dump at `path`, a layer at a time (KV heads in parallel), through a
// temporary file. Peak memory ~ threads x 4 head buffers + one layer of queries.
SynthSummary write_synth_dump(const std::string& path, const SynthOptions& o,
                              const ProgressFn& progress = {});

}  // namespace akv
