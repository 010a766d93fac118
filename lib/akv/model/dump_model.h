#pragma once
// `akv dump`: run the model over one token sequence and write a dump (format v1): keys after
// and before RoPE, values, the queries of the last `window` positions, and the tokens.
#include <string>
#include <vector>

#include "akv/io/dump.h"
#include "akv/model/model.h"

namespace akv {

struct ModelDumpOptions {
  std::size_t window = 32;  // queries of the last `window` positions
  DType dtype = DType::f32;
  int threads = 1;
};

// Returns the dump's metadata. Throws InvalidInput when window is 0 or exceeds the sequence.
DumpMeta dump_model_run(const Model& model, const std::vector<std::int32_t>& tokens,
                        const std::string& out_path, const ModelDumpOptions& o);

}  // namespace akv
