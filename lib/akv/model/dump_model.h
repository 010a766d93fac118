#pragma once
// `akv dump`: run the model over one token sequence and write a dump (format v1): keys after
// and before RoPE, values, the queries of the last `window` positions, and the tokens (and, with
// out_proj, each layer's attention output projection W_o, which CriticalKV reads; with attn_input
// and kvzip_plus, what `akv calibrate` fits KVzap on).
#include <string>
#include <vector>

#include "akv/io/dump.h"
#include "akv/model/model.h"

namespace akv {

struct ModelDumpOptions {
  std::size_t window = 32;  // queries of the last `window` positions
  DType dtype = DType::f32;
  int threads = 1;
  bool out_proj = false;  // write /layers/L/o_proj (the model's W_o as f32, stored in dtype)
  bool attn_input = false;  // write /layers/L/attn_input (each token's attention input, in dtype)
  // Written as /layers/L/kvzip_plus when set: [layer][kv head][token] (eval/kvzip.h computes them).
  const std::vector<std::vector<std::vector<double>>>* kvzip_plus = nullptr;
};

// Returns the dump's metadata. Throws InvalidInput when window is 0 or exceeds the sequence.
DumpMeta dump_model_run(const Model& model, const std::vector<std::int32_t>& tokens,
                        const std::string& out_path, const ModelDumpOptions& o);

}  // namespace akv
