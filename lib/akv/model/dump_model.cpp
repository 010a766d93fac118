#include "akv/model/dump_model.h"

#include "akv/core/errors.h"

namespace akv {

DumpMeta dump_model_run(const Model& model, const std::vector<std::int32_t>& tokens,
                        const std::string& out_path, const ModelDumpOptions& o) {
  const ModelConfig& c = model.config();
  const std::size_t n = tokens.size();
  if (o.window == 0 || o.window > n) {
    throw InvalidInput("window must be in [1, sequence length " + std::to_string(n) + "]",
                       {"", "--window", std::to_string(o.window)});
  }
  // Only the window's queries are written: the prefill keeps no others.
  std::vector<RowMatrix> inputs(o.attn_input ? c.n_layers : 0);  // [layer] [n, dim] with attn_input
  const LayerInputFn keep = [&](std::size_t l, std::size_t first, const RowMatrix& x) {
    if (inputs[l].size() == 0) inputs[l].resize(static_cast<Eigen::Index>(n), x.cols());
    inputs[l].middleRows(static_cast<Eigen::Index>(first), x.rows()) = x;
  };
  const PrefillResult r = model.prefill(tokens, false, o.threads, o.window, o.attn_input ? keep : LayerInputFn{});
  DumpMeta m;
  m.kv_shape() = c.kv_shape();
  m.model = c.name;
  m.n_tokens = n;
  m.n_query = o.window;
  DumpWriteOptions wo;
  wo.dtype = o.dtype;
  wo.key_pre_rope = true;
  if (o.out_proj) wo.out_proj_hidden = c.dim;
  if (o.attn_input) wo.input_dim = c.dim;
  wo.kvzip_plus = o.kvzip_plus != nullptr;
  DumpWriter w(out_path, m, wo);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    w.write(l, DumpField::key, 0, r.key[l]);
    w.write(l, DumpField::key_pre_rope, 0, r.key_pre_rope[l]);
    w.write(l, DumpField::value, 0, r.value[l]);
    w.write(l, DumpField::query, 0, r.query[l]);
    if (o.out_proj) w.write_out_proj(l, model.weights().layers[l].wo.to_f32());
    if (o.attn_input) w.write_attn_input(l, inputs[l]);
    if (o.kvzip_plus) w.write_kvzip_plus(l, (*o.kvzip_plus).at(l));
  }
  w.write_tokens(tokens);
  w.commit();
  return m;
}

}  // namespace akv
