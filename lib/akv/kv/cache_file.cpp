#include "akv/kv/cache_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "akv/core/atomic_file.h"
#include "akv/core/errors.h"
#include "akv/io/json_file.h"
#include "akv/method/ggml_params.h"
#include "akv/quant/pack.h"
#include "akv/tensor/half.h"
#include "akv/tensor/turboquant.h"

namespace akv {
namespace {

constexpr const char* kParts[] = {"key", "value"};

std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

// A non-negative integer attribute of a cache object.
std::size_t count_attr(hid_t obj, const std::string& name, const std::string& file,
                       const std::string& where) {
  const std::int64_t v = h5::read_attr_int(obj, name, file, where + "." + name);
  if (v < 0) throw CorruptData("attribute must be >= 0", {file, where + "." + name, std::to_string(v)});
  return static_cast<std::size_t>(v);
}

// Whether some tensor of a joint plan's heads has a cache type (CompressParams::head_tensor_types)
// for which `is` holds.
template <class Is>
bool any_head_tensor_type(const CompressParams& p, Is is) {
  return std::any_of(p.head_tensor_types.begin(), p.head_tensor_types.end(),
                     [&](const auto& t) { return (!t.first.empty() && is(t.first)) || (!t.second.empty() && is(t.second)); });
}

// Whether a cache of these parameters has rotated rows (version 4, unless its fp8 or nuq version).
bool rotated_rows(const CompressParams& p) {
  return p.rotate != RotationKind::none || (p.ggml() && p.ggml()->rotates_heads()) ||
         std::any_of(p.head_rotate.begin(), p.head_rotate.end(), [](RotationKind r) { return r != RotationKind::none; }) ||
         any_head_tensor_type(p, [](const std::string& t) { return t.find('+') != std::string::npos; });
}

// Whether the cache stores ggml blocks (version 3 or later): method ggml, or a joint plan's heads
// with cache types.
bool ggml_blocks(const CompressParams& p) {
  return p.ggml() || any_head_tensor_type(p, [](const std::string&) { return true; });
}

// Whether some tensor is fp8 (version 5).
bool fp8_rows(const CompressParams& p) {
  return (p.ggml() && p.ggml()->fp8()) || any_head_tensor_type(p, [](const std::string& t) { return t.rfind("fp8_", 0) == 0; });
}

// The rotation attributes of a key or value group (version 4; none when absent).
Rotation read_rotation(hid_t group, const std::string& file, const std::string& where, std::size_t head_dim) {
  if (!h5::attr_exists(group, "rotate")) return {};
  Rotation r;
  r.kind = parse_rotation(h5::read_attr_string(group, "rotate", file, where + ".rotate"), file, where + ".rotate");
  const std::size_t block = count_attr(group, "rotate_block", file, where);
  if (r.kind == RotationKind::none || block == 0 || (block & (block - 1)) != 0 || head_dim % block != 0) {
    throw CorruptData("rotate_block must be a power of two dividing head_dim " + std::to_string(head_dim),
                      {file, where + ".rotate_block", std::to_string(block)});
  }
  r.block = static_cast<std::uint32_t>(block);
  r.seed = count_attr(group, "rotate_seed", file, where);
  return r;
}

// llama.cpp's name of a cache type ("Q4_0" -> "q4_0").
// The method's spelling of a cache type: the lower-case name, without a TurboQuant type's
// head_dim suffix (tq3nc, not tq3nc_128).
std::string cache_type_name(const GgmlTypeInfo& t) {
  std::string s = t.name;
  if (tq_type_of(t)) s = s.substr(0, s.find('_'));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A nuq tensor (version 6): attributes bits, per_channel, sparsity, sink (the table's) and
// n_sink; datasets levels f32 [2^bits], upper/lower f16 [head_dim] (keys), sink f16 [n_sink,
// head_dim], codes uint8 [(n_quant - n_sink) * row bytes], offset/range f32 [n_quant - n_sink]
// (values), sparse_counts uint16 [n_quant - n_sink], sparse_channels uint16 and sparse_values
// f16 [outliers]; each present when non-empty.
void write_nuq(hid_t group, const PackedTensor& p, std::size_t d, hid_t f16) {
  const NuqTable& t = *p.nuq_table();
  const NuqRows& r = p.nuq_rows();
  h5::write_attr_int(group, "bits", t.bits);
  h5::write_attr_int(group, "per_channel", t.per_channel ? 1 : 0);
  h5::write_attr_double(group, "sparsity", t.sparsity);
  h5::write_attr_int(group, "sink", i64(t.sink));
  h5::write_attr_int(group, "n_sink", i64(r.sink_rows));
  if (r.rows == 0) return;
  const auto put = [&](const char* name, hid_t file_type, hid_t mem_type, std::vector<unsigned long long> dims,
                        const void* data) {
    std::size_t n = 1;
    for (const unsigned long long e : dims) n *= e;
    if (n > 0) h5::write_dataset(group, name, file_type, mem_type, dims, data);
  };
  put("levels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {t.levels.size()}, t.levels.data());
  put("upper", f16, f16, {t.upper.size()}, t.upper.data());
  put("lower", f16, f16, {t.lower.size()}, t.lower.data());
  put("sink", f16, f16, {r.sink_rows, d}, r.sink.data());
  put("codes", H5T_STD_U8LE, H5T_NATIVE_UINT8, {r.codes.size()}, r.codes.data());
  put("offset", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {r.offset.size()}, r.offset.data());
  put("range", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {r.range.size()}, r.range.data());
  std::vector<std::uint16_t> counts(r.outlier_end.size());
  for (std::size_t i = 0; i < counts.size(); ++i) {
    counts[i] = static_cast<std::uint16_t>(r.outlier_end[i] - (i == 0 ? 0 : r.outlier_end[i - 1]));
  }
  put("sparse_counts", H5T_STD_U16LE, H5T_NATIVE_UINT16, {counts.size()}, counts.data());
  put("sparse_channels", H5T_STD_U16LE, H5T_NATIVE_UINT16, {r.outlier_channel.size()}, r.outlier_channel.data());
  put("sparse_values", f16, f16, {r.outlier_value.size()}, r.outlier_value.data());
}

void write_part(hid_t group, const PackedTensor& p, std::size_t d, hid_t f16) {
  const std::size_t n_quant = p.ggml_type()   ? p.ggml_rows()
                              : p.nuq_table() ? p.nuq_rows().rows
                                              : p.packed_rows(),
                    n_out = p.outlier_channels().size();
  h5::write_attr_int(group, "n_quant", i64(n_quant));
  h5::write_attr_int(group, "n_residual", i64(p.dense_rows()));
  h5::write_attr_int(group, "n_outlier", i64(n_out));
  h5::write_attr_int(group, "pre_rope", p.pre_rope() ? 1 : 0);
  if (p.rotation().active()) {
    h5::write_attr_string(group, "rotate", rotation_name(p.rotation().kind));
    h5::write_attr_int(group, "rotate_block", i64(p.rotation().block));
    h5::write_attr_int(group, "rotate_seed", static_cast<std::int64_t>(p.rotation().seed));
  }
  if (p.nuq_table()) {
    write_nuq(group, p, d, f16);
    return;
  }
  if (p.ggml_type()) {
    h5::write_attr_string(group, "ggml_type", cache_type_name(*p.ggml_type()));
    if (fp8_format_of(*p.ggml_type())) h5::write_attr_double(group, "fp8_scale", p.ggml_scale());
    if (!p.ggml_blocks().empty()) {
      h5::write_dataset(group, "blocks", H5T_STD_U8LE, H5T_NATIVE_UINT8, {p.ggml_blocks().size()}, p.ggml_blocks().data());
    }
    return;
  }
  if (n_quant > 0) {
    const PackedView& b = p.packed_params();
    h5::write_attr_int(group, "bits", b.bits);
    h5::write_attr_string(group, "axis", quant_axis_name(b.axis));
    h5::write_attr_int(group, "group", i64(b.group));
    h5::write_dataset(group, "codes", H5T_STD_U8LE, H5T_NATIVE_UINT8, {p.code_bytes()}, p.codes());
    h5::write_dataset(group, "scale", f16, f16, {p.scales().size()}, p.scales().data());
    h5::write_dataset(group, "zero", f16, f16, {p.zeros().size()}, p.zeros().data());
  }
  if (n_out > 0) {
    h5::write_dataset(group, "outlier_channels", H5T_STD_U16LE, H5T_NATIVE_UINT16, {n_out},
                      p.outlier_channels().data());
    h5::write_dataset(group, "outlier_values", f16, f16, {n_quant, n_out}, p.outlier_values().data());
  }
  if (p.dense_rows() > 0) {
    if (p.dense_type() != DenseType::f16) throw InvalidInput("cache files store f16 residual rows", {"", "residual"});
    h5::write_dataset(group, "residual", f16, f16, {p.dense_rows(), d}, p.dense_f16(0));
  }
}

}  // namespace

std::string cache_head_path(std::size_t layer, std::size_t head) {
  return "/layers/" + std::to_string(layer) + "/heads/" + std::to_string(head);
}

CacheRope cache_rope(const CacheReader& cache, const DumpMeta& m) {
  CacheRope r;
  if (cache.header().params.pre_rope) r.table = std::make_unique<RopeTable>(m.head_dim, m.rope_theta, 0, m.n_tokens);
  r.context = RopeContext{m.rope_layout, r.table.get()};
  return r;
}

// ---------------------------------------------------------------------------------------------
struct CacheWriter::Impl {
  CacheHeader header;
  AtomicOutput out;
  h5::File file;
  h5::Type f16;
  std::vector<std::vector<bool>> written;  // [layer][head]
  Impl(std::string path, CacheHeader h) : header(std::move(h)), out(std::move(path)) {}
};

CacheWriter::CacheWriter(std::string path, CacheHeader header, const CachePart& part)
    : impl_(std::make_unique<Impl>(std::move(path), std::move(header))) {
  Impl& m = *impl_;
  m.file = h5::create(m.out.temp_path(), m.out.path());
  m.f16 = h5::make_f16_type();
  hid_t root = m.file.get();
  const CacheHeader& h = m.header;
  h5::write_attr_string(root, "format", part.partial() ? kCachePartFormat : kCacheFormat);
  if (part.partial()) {
    h5::write_attr_int(root, "shard", i64(part.shard));
    h5::write_attr_int(root, "shards", i64(part.shards));
    h5::write_attr_int(root, "first_layer", i64(part.first_layer));
    h5::write_attr_int(root, "end_layer", i64(part.end_layer));
  }
  h5::write_attr_int(root, "version", h.params.method == Quantizer::nuq ? kCacheVersionNuq
                                      : fp8_rows(h.params)                 ? kCacheVersionFp8
                                      : rotated_rows(h.params)             ? kCacheVersionRotation
                                      : h.params.tiered()                  ? kCacheVersionSegments
                                      : ggml_blocks(h.params)              ? kCacheVersionGgml
                                                                           : kCacheVersion);
  // A calibration= path that is not UTF-8 is stored with U+FFFD (JSON text is UTF-8).
  h5::write_attr_string(root, "params", h.params.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  h5::write_attr_string(root, "source_path", h.source_path);
  h5::write_attr_string(root, "source_hash", h.source_hash);
  h5::write_attr_int(root, "source_bytes", static_cast<std::int64_t>(h.source_bytes));
  write_shape_attrs(root, h.meta);
  h5::write_attr_int(root, "n_query", i64(h.meta.n_query));
  m.written.assign(h.meta.n_layers, std::vector<bool>(h.meta.n_kv_heads, false));
  if (part.partial()) {  // only the part's layers are expected
    for (std::size_t l = 0; l < h.meta.n_layers; ++l) {
      if (l < part.first_layer || l >= part.end_layer) m.written[l].assign(h.meta.n_kv_heads, true);
    }
  }
}

CacheWriter::~CacheWriter() = default;

namespace {

void write_head_group(hid_t g, const HeadCache& h, hid_t f16) {
  h5::write_attr_int(g, "n_tokens", i64(h.n_tokens));
  h5::write_attr_int(g, "n_kept", i64(h.n_kept()));
  if (!h.segments.empty()) {
    h5::write_attr_int(g, "n_segments", i64(h.segments.size()));
    for (std::size_t s = 0; s < h.segments.size(); ++s) {
      h5::Group sg = h5::create_group(g, "segments/" + std::to_string(s));
      write_head_group(sg.get(), h.segments[s], f16);
    }
    return;
  }
  if (!h.kept.empty()) {
    h5::write_dataset(g, "kept", H5T_STD_I32LE, H5T_NATIVE_INT32, {h.kept.size()}, h.kept.data());
  }
  const PackedTensor* parts[] = {&h.key, &h.value};
  for (int i = 0; i < 2; ++i) {
    h5::Group pg = h5::create_group(g, kParts[i]);
    write_part(pg.get(), *parts[i], h.head_dim, f16);
  }
}

}  // namespace

void CacheWriter::write_head(std::size_t layer, std::size_t head, const HeadCache& h) {
  Impl& m = *impl_;
  const std::string path = cache_head_path(layer, head);
  if (layer >= m.header.meta.n_layers || head >= m.header.meta.n_kv_heads) {
    throw InvalidInput("head out of range", {m.out.path(), path});
  }
  if (!h.segments.empty() && !m.header.params.tiered()) {
    throw InvalidInput("segmented heads need a tiered cache", {m.out.path(), path});
  }
  const bool typed = !m.header.params.head_tensor_types.empty();  // a joint plan's: per tensor
  if (!typed && (h.key.ggml_type() != nullptr) != (m.header.params.ggml() != nullptr)) {
    throw InvalidInput("ggml blocks go with method ggml only", {m.out.path(), path});
  }
  if ((h.key.nuq_table() != nullptr) != (m.header.params.method == Quantizer::nuq && h.n_kept() > 0)) {
    throw InvalidInput("nuq codes go with method nuq only", {m.out.path(), path});
  }
  h5::Group g = h5::create_group(m.file.get(), path);
  write_head_group(g.get(), h, m.f16.get());
  m.written[layer][head] = true;
}

void CacheWriter::commit() {
  Impl& m = *impl_;
  for (std::size_t l = 0; l < m.written.size(); ++l) {
    for (std::size_t h = 0; h < m.written[l].size(); ++h) {
      if (!m.written[l][h]) {
        throw InvalidInput("cache incomplete: head not written", {m.out.path(), cache_head_path(l, h)});
      }
    }
  }
  if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) throw IoError("cannot flush", {m.out.path()});
  m.file.reset();
  m.out.commit();
}

// ---------------------------------------------------------------------------------------------
CacheReader::CacheReader(std::string path, bool allow_part) : path_(std::move(path)) {
  file_ = h5::open_read(path_);
  std::error_code ec;
  file_bytes_ = std::filesystem::file_size(path_, ec);
  hid_t root = file_.get();
  const std::string& f = path_;
  const std::string format = h5::read_attr_string(root, "format", f, "format");
  if (format == kCachePartFormat && !allow_part) {
    throw InvalidInput("a partial cache (one shard of akv compress --shard): combine the parts with akv merge",
                       {f, "format", format});
  }
  if (format != kCacheFormat && format != kCachePartFormat) {
    throw InvalidInput(std::string("not an akv cache (expected format \"") + kCacheFormat + "\")",
                       {f, "format", format});
  }
  const std::int64_t version = h5::read_attr_int(root, "version", f, "version");
  if (version < kCacheVersion || version > kCacheVersionNuq) {
    throw InvalidInput("unsupported akv-cache version (this akv reads versions 1 to 6)",
                       {f, "version", std::to_string(version)});
  }
  version_ = version;
  const std::string params = h5::read_attr_string(root, "params", f, "params");
  nlohmann::json j = parse_json(params, f, "params");
  if (!j.is_object()) throw CorruptData("params is not a JSON object", {f, "params"});
  header_.params = CompressParams::from_json(j, f);
  if (version_ == kCacheVersionGgml && !ggml_blocks(header_.params)) {
    throw CorruptData("version 3 and ggml blocks (method ggml, per-head cache types) go together",
                      {f, "version", std::to_string(version)});
  }
  if (ggml_blocks(header_.params) && version_ < kCacheVersionGgml) {
    throw CorruptData("ggml blocks need version 3 or later", {f, "version", std::to_string(version)});
  }
  if ((version_ == kCacheVersionNuq) != (header_.params.method == Quantizer::nuq)) {
    throw CorruptData("version 6 and method nuq go together", {f, "version", std::to_string(version)});
  }
  const bool fp8 = fp8_rows(header_.params);
  if ((version_ == kCacheVersionFp8) != fp8) {
    throw CorruptData("version 5 and fp8 cache types go together", {f, "version", std::to_string(version)});
  }
  if (!fp8 && version_ != kCacheVersionNuq &&
      (version_ == kCacheVersionRotation) != rotated_rows(header_.params)) {
    throw CorruptData("version 4 and params.rotate (or per-head types with a rotation) go together",
                      {f, "version", std::to_string(version)});
  }
  header_.source_path = h5::read_attr_string(root, "source_path", f, "source_path");
  header_.source_hash = h5::read_attr_string(root, "source_hash", f, "source_hash");
  header_.source_bytes = count_attr(root, "source_bytes", f, "");
  read_shape_attrs(root, f, header_.meta);
  header_.meta.n_query = count_attr(root, "n_query", f, "");
  part_.end_layer = header_.meta.n_layers;
  if (format == kCachePartFormat) {
    part_.shard = count_attr(root, "shard", f, "");
    part_.shards = count_attr(root, "shards", f, "");
    part_.first_layer = count_attr(root, "first_layer", f, "");
    part_.end_layer = count_attr(root, "end_layer", f, "");
    if (part_.shard < 1 || part_.shard > part_.shards || part_.first_layer > part_.end_layer ||
        part_.end_layer > header_.meta.n_layers) {
      throw CorruptData("partial cache layers or shard out of range", {f, "shard/first_layer/end_layer"});
    }
  }
  for (std::size_t l = part_.first_layer; l < part_.end_layer; ++l) {
    for (std::size_t h = 0; h < header_.meta.n_kv_heads; ++h) {
      const std::string p = cache_head_path(l, h);
      if (!h5::link_exists(root, p)) throw CorruptData("missing head group", {f, p});
    }
  }
}

CacheReader::~CacheReader() = default;

HeadCache CacheReader::read_head(std::size_t layer, std::size_t head) const {
  const std::string path = cache_head_path(layer, head);
  if (layer >= meta().n_layers || head >= meta().n_kv_heads) {
    throw InvalidInput("head out of range", {path_, path});
  }
  return read_head_group(path, layer, head, true);
}

namespace {

// f16 values (bits) stored as data must be finite: a NaN or infinity would pass through
// decompress and attention as a result.
void check_finite_f16(const std::vector<std::uint16_t>& v, const std::string& file, const std::string& dataset) {
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (f16_nonfinite(v[i])) {
      throw CorruptData("non-finite f16 value", {file, dataset + "[" + std::to_string(i) + "]",
                                                 std::to_string(f16_to_f32_ref(v[i]))});
    }
  }
}

}  // namespace

HeadCache CacheReader::read_head_group(const std::string& path, std::size_t layer, std::size_t head, bool top) const {
  const std::string& f = path_;
  h5::Group g(H5Gopen2(file_.get(), path.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw CorruptData("cannot open head group", {f, path});
  HeadCache h;
  h.head_dim = meta().head_dim;
  h.n_tokens = count_attr(g.get(), "n_tokens", f, path);
  if (h.n_tokens != meta().n_tokens) {
    throw CorruptData("head n_tokens differs from the file's n_tokens " +
                          std::to_string(meta().n_tokens),
                      {f, path + ".n_tokens", std::to_string(h.n_tokens)});
  }
  const std::size_t n_kept = count_attr(g.get(), "n_kept", f, path);
  if (h5::attr_exists(g.get(), "n_segments")) {
    const std::size_t n_seg = count_attr(g.get(), "n_segments", f, path);
    if (!top || version_ < kCacheVersionSegments || n_seg == 0 || n_seg > 16 || n_kept != h.n_tokens) {
      throw CorruptData("segments only in version-2 head groups (1..16 of them, covering every token)",
                        {f, path + ".n_segments", std::to_string(n_seg)});
    }
    read_segments(path, layer, head, n_seg, h);
    return h;
  }
  if (n_kept > h.n_tokens) {
    throw CorruptData("n_kept exceeds n_tokens " + std::to_string(h.n_tokens),
                      {f, path + ".n_kept", std::to_string(n_kept)});
  }
  if (h5::link_exists(g.get(), "kept")) {
    read_kept(path + "/kept", n_kept, h);
  } else if (n_kept != h.n_tokens) {
    throw CorruptData("n_kept differs from n_tokens but no kept dataset",
                      {f, path + ".n_kept", std::to_string(n_kept)});
  }
  read_part(path + "/" + kParts[0], true, layer, head, n_kept, h.kept, h.key);
  read_part(path + "/" + kParts[1], false, layer, head, n_kept, h.kept, h.value);
  return h;
}

void CacheReader::read_segments(const std::string& path, std::size_t layer, std::size_t head, std::size_t n_seg,
                                HeadCache& h) const {
  const std::string& f = path_;
  std::uint64_t total = 0;  // kept tokens of all segments: each read from stored data
  for (std::size_t s = 0; s < n_seg; ++s) {
    const std::string sp = path + "/segments/" + std::to_string(s);
    if (!h5::link_exists(file_.get(), sp)) throw CorruptData("missing segment", {f, sp});
    h.segments.push_back(read_head_group(sp, layer, head, false));
    total += h.segments.back().n_kept();
  }
  if (total != h.n_tokens) {
    throw CorruptData("segments must hold n_tokens " + std::to_string(h.n_tokens) + " positions",
                      {f, path + "/segments", std::to_string(total)});
  }
  std::vector<bool> seen(h.n_tokens, false);
  for (std::size_t s = 0; s < n_seg; ++s) {
    const std::string sp = path + "/segments/" + std::to_string(s);
    const HeadCache& seg = h.segments[s];
    for (std::size_t i = 0; i < seg.n_kept(); ++i) {
      const std::size_t p = seg.position(i);
      if (seen[p]) throw CorruptData("a position sits in two segments", {f, sp + "/kept", std::to_string(p)});
      seen[p] = true;
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    throw CorruptData("segments do not cover every token", {f, path + "/segments"});
  }
}

void CacheReader::read_kept(const std::string& dataset, std::size_t n_kept, HeadCache& h) const {
  h.kept = h5::read_vector<std::int32_t>(file_.get(), dataset, H5T_NATIVE_INT32, {n_kept}, path_);
  for (std::size_t i = 0; i < n_kept; ++i) {
    const std::int32_t v = h.kept[i];
    if (v < 0 || static_cast<std::size_t>(v) >= h.n_tokens || (i > 0 && v <= h.kept[i - 1])) {
      throw CorruptData("kept positions must be ascending and inside [0, n_tokens)",
                        {path_, dataset + "[" + std::to_string(i) + "]", std::to_string(v)});
    }
  }
}

void CacheReader::read_part(const std::string& pp, bool key, std::size_t layer, std::size_t head, std::size_t n_kept,
                            const std::vector<std::int32_t>& kept, PackedTensor& p) const {
  const std::string& f = path_;
  const std::size_t d = meta().head_dim;
  h5::Group pg(H5Gopen2(file_.get(), pp.c_str(), H5P_DEFAULT));
  if (!pg.valid()) throw CorruptData("missing group", {f, pp});
  p = PackedTensor(d, DenseType::f16);
  const std::size_t n_quant = count_attr(pg.get(), "n_quant", f, pp);
  const std::size_t n_residual = count_attr(pg.get(), "n_residual", f, pp);
  const std::size_t n_out = count_attr(pg.get(), "n_outlier", f, pp);
  p.set_pre_rope(count_attr(pg.get(), "pre_rope", f, pp) != 0);
  p.set_rotation(read_rotation(pg.get(), f, pp, d));
  if (p.rotation().active() && version_ < kCacheVersionRotation) {
    throw CorruptData("rotated rows only in version-4 and -5 caches", {f, pp + ".rotate", rotation_name(p.rotation().kind)});
  }
  if (n_quant > n_kept || n_residual > n_kept || n_quant + n_residual != n_kept) {
    throw CorruptData("n_quant + n_residual must equal n_kept " + std::to_string(n_kept),
                      {f, pp + ".n_quant", std::to_string(n_quant)});
  }
  if (n_out >= d || (n_out > 0 && n_quant == 0)) {
    throw CorruptData("bad outlier channel count", {f, pp + ".n_outlier", std::to_string(n_out)});
  }
  const std::size_t L = meta().n_layers, H = meta().n_kv_heads;
  if (const GgmlCacheParams* g = header_.params.ggml()) {
    // Boundary layers store f16 (GgmlCacheParams::boundary); per-head types their head's.
    if (!g->types.empty() && g->head_types.size() != L * H) {
      throw CorruptData("per-head types for another shape", {f, "params.ggml.head_types", std::to_string(g->head_types.size())});
    }
    read_ggml_part(pp, key ? g->key_type(layer, head, L, H) : g->value_type(layer, head, L, H), n_quant,
                   n_residual == 0 && n_out == 0, p);
    return;
  }
  const auto& types = header_.params.head_tensor_types;
  if (!types.empty()) {  // a joint plan's head: a tensor of bits 0 holds its cache type's blocks
    if (types.size() != L * H) {
      throw CorruptData("per-head cache types for another shape", {f, "params.head_tensor_types", std::to_string(types.size())});
    }
    const std::string& type = key ? types[layer * H + head].first : types[layer * H + head].second;
    if (!type.empty()) {
      read_ggml_part(pp, type, n_quant, n_residual == 0 && n_out == 0, p);
      return;
    }
  }
  if (h5::attr_exists(pg.get(), "ggml_type")) {
    throw CorruptData("ggml blocks in a tensor that has no cache type", {f, pp + ".ggml_type"});
  }
  if (header_.params.method == Quantizer::nuq) {
    if (n_quant != n_kept || n_out != 0 || p.pre_rope() != (key && n_kept > 0)) {
      throw CorruptData("nuq parts code every row (keys before RoPE), with no residual or outlier channels",
                        {f, pp + ".n_quant", std::to_string(n_quant)});
    }
    read_nuq_part(pp, key, n_quant, kept, p);
    return;
  }
  if (n_quant > 0) read_affine_rows(pp, pg.get(), n_quant, n_out, p);
  if (n_residual > 0) {
    const std::vector<std::uint16_t> residual =
        h5::read_vector<std::uint16_t>(file_.get(), pp + "/residual", h5::make_f16_type().get(), {n_residual, d}, f);
    check_finite_f16(residual, f, pp + "/residual");
    p.insert_dense_f16(0, residual.data(), n_residual);
  }
}

void CacheReader::read_affine_rows(const std::string& pp, hid_t pg, std::size_t n_quant, std::size_t n_out,
                                   PackedTensor& p) const {
  const std::string& f = path_;
  const std::size_t d = meta().head_dim;
  h5::Type f16 = h5::make_f16_type();
  QuantizedBlock b;
  b.bits = static_cast<int>(count_attr(pg, "bits", f, pp));
  if (!is_supported_bits(b.bits)) {
    throw CorruptData("unsupported bit width", {f, pp + ".bits", std::to_string(b.bits)});
  }
  const std::string axis = h5::read_attr_string(pg, "axis", f, pp + ".axis");
  if (axis != "channel" && axis != "token") throw CorruptData("unknown axis", {f, pp + ".axis", axis});
  b.axis = parse_quant_axis(axis);
  b.group = count_attr(pg, "group", f, pp);
  if (b.group == 0) throw CorruptData("group size must be >= 1", {f, pp + ".group", "0"});
  b.rows = n_quant;
  b.cols = d - n_out;
  // n_quant <= n_kept <= n_tokens and cols < head_dim: the products cannot wrap, and every
  // vector below is allocated only after its dataset's shape and stored bytes check out.
  const std::size_t codes = packed_size(b.rows * b.cols, b.bits);
  b.codes = h5::read_vector<std::uint8_t>(file_.get(), pp + "/codes", H5T_NATIVE_UINT8, {codes}, f);
  b.scale = h5::read_vector<std::uint16_t>(file_.get(), pp + "/scale", f16.get(), {b.n_groups()}, f);
  b.zero = h5::read_vector<std::uint16_t>(file_.get(), pp + "/zero", f16.get(), {b.n_groups()}, f);
  for (std::size_t k = 0; k < b.scale.size(); ++k) {
    const float s = f16_to_f32_ref(b.scale[k]), z = f16_to_f32_ref(b.zero[k]);
    if (!std::isfinite(s) || s < 0.0f) {
      throw CorruptData("scale not finite or negative",
                        {f, pp + "/scale[" + std::to_string(k) + "]", format_number(s)});
    }
    if (!std::isfinite(z)) {
      throw CorruptData("zero not finite", {f, pp + "/zero[" + std::to_string(k) + "]", format_number(z)});
    }
  }
  std::vector<std::uint16_t> channels, values;
  if (n_out > 0) {
    channels = h5::read_vector<std::uint16_t>(file_.get(), pp + "/outlier_channels", H5T_NATIVE_UINT16, {n_out}, f);
    for (std::size_t k = 0; k < n_out; ++k) {
      const std::uint16_t c = channels[k];
      if (c >= d || (k > 0 && c <= channels[k - 1])) {
        throw CorruptData("outlier channels must be ascending and < head_dim",
                          {f, pp + "/outlier_channels[" + std::to_string(k) + "]", std::to_string(c)});
      }
    }
    values = h5::read_vector<std::uint16_t>(file_.get(), pp + "/outlier_values", f16.get(), {n_quant, n_out}, f);
    check_finite_f16(values, f, pp + "/outlier_values");
  }
  p.append_packed(b, channels, values.data());
}

void CacheReader::read_ggml_part(const std::string& pp, const std::string& type_name, std::size_t n_rows,
                                 bool rows_only, PackedTensor& p) const {
  const std::string& f = path_;
  h5::Group pg(H5Gopen2(file_.get(), pp.c_str(), H5P_DEFAULT));
  const std::string stored = h5::read_attr_string(pg.get(), "ggml_type", f, pp + ".ggml_type");
  const std::string base = parse_head_type(type_name, f, "params.ggml").name;  // without a head's rotation
  if (stored != base) {
    throw CorruptData("ggml_type differs from the method's type " + base, {f, pp + ".ggml_type", stored});
  }
  if (!rows_only || p.pre_rope()) {
    throw CorruptData("ggml parts have no residual, outliers or pre-RoPE keys", {f, pp + ".n_residual"});
  }
  const std::size_t d = meta().head_dim;
  const GgmlTypeInfo& type = ggml_cache_type(base, d, f, pp + ".ggml_type");
  if (d % type.block != 0) {
    throw CorruptData("head_dim is not a multiple of the ggml type's block " + std::to_string(type.block),
                      {f, "head_dim", std::to_string(d)});
  }
  // n_rows <= n_tokens and head_dim are bounded by the header: the size cannot wrap.
  const std::size_t n = n_rows * d;
  std::vector<std::uint8_t> blocks;
  if (n > 0) {
    blocks = h5::read_vector<std::uint8_t>(file_.get(), pp + "/blocks", H5T_NATIVE_UINT8, {n / type.block * type.bytes}, f);
  }
  if (fp8_format_of(type)) {
    const double scale = h5::read_attr_double(pg.get(), "fp8_scale", f, pp + ".fp8_scale");
    if (!(scale > 0.0 && scale <= 3.4e38) || static_cast<double>(static_cast<float>(scale)) != scale) {
      throw CorruptData("an fp8 scale must be a positive finite f32", {f, pp + ".fp8_scale", format_number(scale)});
    }
    p.set_ggml_scale(static_cast<float>(scale));
  }
  const std::size_t bad = ggml_first_nonfinite(type, blocks.data(), n);
  if (bad < n) {
    throw CorruptData("non-finite value in a ggml block", {f, pp + "/blocks", "element " + std::to_string(bad)});
  }
  p.append_ggml_blocks(type, blocks.data(), n_rows);
}

void CacheReader::read_nuq_part(const std::string& pp, bool key, std::size_t n_rows,
                                const std::vector<std::int32_t>& kept, PackedTensor& p) const {
  const std::string& f = path_;
  const std::size_t d = meta().head_dim;
  h5::Group pg(H5Gopen2(file_.get(), pp.c_str(), H5P_DEFAULT));
  auto t = std::make_shared<NuqTable>();
  t->bits = static_cast<int>(count_attr(pg.get(), "bits", f, pp));
  if (!is_supported_bits(t->bits)) throw CorruptData("unsupported bit width", {f, pp + ".bits", std::to_string(t->bits)});
  if ((count_attr(pg.get(), "per_channel", f, pp) != 0) != key) {
    throw CorruptData("nuq keys are normalized per channel, values per row", {f, pp + ".per_channel"});
  }
  t->per_channel = key;
  t->sparsity = h5::read_attr_double(pg.get(), "sparsity", f, pp + ".sparsity");
  if (!(t->sparsity > 0.0 && t->sparsity <= 1.0)) {
    throw CorruptData("nuq sparsity must be in (0, 1]", {f, pp + ".sparsity", format_number(t->sparsity)});
  }
  t->sink = count_attr(pg.get(), "sink", f, pp);
  NuqRows r;
  r.rows = n_rows;
  r.sink_rows = count_attr(pg.get(), "n_sink", f, pp);
  // The rows at positions below sink: the first min(sink, n) rows, or the kept ones below it.
  const std::size_t sinks = kept.empty() ? std::min(t->sink, n_rows)
                                         : static_cast<std::size_t>(std::count_if(kept.begin(), kept.end(), [&](std::int32_t x) {
                                             return static_cast<std::size_t>(x) < t->sink;
                                           }));
  if (r.sink_rows != sinks) {
    throw CorruptData("n_sink must count the rows at positions below sink (" + std::to_string(sinks) + ")",
                      {f, pp + ".n_sink", std::to_string(r.sink_rows)});
  }
  p.set_pre_rope(key && n_rows > 0);
  if (n_rows == 0) {
    p.set_nuq(t, std::move(r));
    return;
  }
  h5::Type f16 = h5::make_f16_type();
  const std::size_t coded = n_rows - r.sink_rows;  // n_rows <= n_tokens: the sizes below cannot wrap
  t->levels = h5::read_vector<float>(file_.get(), pp + "/levels", H5T_NATIVE_FLOAT, {std::size_t{1} << t->bits}, f);
  for (std::size_t i = 0; i < t->levels.size(); ++i) {
    if (!std::isfinite(t->levels[i]) || (i > 0 && t->levels[i] < t->levels[i - 1])) {
      throw CorruptData("nuq levels must be finite and ascending", {f, pp + "/levels[" + std::to_string(i) + "]",
                                                                  format_number(t->levels[i])});
    }
  }
  if (key) {
    t->upper = h5::read_vector<std::uint16_t>(file_.get(), pp + "/upper", f16.get(), {d}, f);
    t->lower = h5::read_vector<std::uint16_t>(file_.get(), pp + "/lower", f16.get(), {d}, f);
    check_finite_f16(t->upper, f, pp + "/upper");
    check_finite_f16(t->lower, f, pp + "/lower");
    for (std::size_t c = 0; c < d; ++c) {
      if (f16_to_f32_ref(t->lower[c]) > f16_to_f32_ref(t->upper[c])) {
        throw CorruptData("nuq thresholds must have lower <= upper", {f, pp + "/lower[" + std::to_string(c) + "]",
                                                                    format_number(f16_to_f32_ref(t->lower[c]))});
      }
    }
  }
  if (r.sink_rows > 0) {
    r.sink = h5::read_vector<std::uint16_t>(file_.get(), pp + "/sink", f16.get(), {r.sink_rows, d}, f);
    check_finite_f16(r.sink, f, pp + "/sink");
  }
  if (coded > 0) {
    r.codes = h5::read_vector<std::uint8_t>(file_.get(), pp + "/codes", H5T_NATIVE_UINT8, {coded * packed_size(d, t->bits)}, f);
    if (!key) {
      r.offset = h5::read_vector<float>(file_.get(), pp + "/offset", H5T_NATIVE_FLOAT, {coded}, f);
      r.range = h5::read_vector<float>(file_.get(), pp + "/range", H5T_NATIVE_FLOAT, {coded}, f);
      for (std::size_t i = 0; i < coded; ++i) {
        if (!std::isfinite(r.offset[i]) || !std::isfinite(r.range[i]) || r.range[i] < 0.0f) {
          throw CorruptData("nuq offsets must be finite and ranges finite and >= 0",
                            {f, pp + "/range[" + std::to_string(i) + "]", format_number(r.range[i])});
        }
      }
    }
    const std::vector<std::uint16_t> counts =
        h5::read_vector<std::uint16_t>(file_.get(), pp + "/sparse_counts", H5T_NATIVE_UINT16, {coded}, f);
    std::uint64_t total = 0;
    for (const std::uint16_t c : counts) {
      if (c > d) throw CorruptData("more outliers in a row than head_dim", {f, pp + "/sparse_counts", std::to_string(c)});
      total += c;
      r.outlier_end.push_back(static_cast<std::uint32_t>(total));
    }
    if (total > 0) {
      r.outlier_channel = h5::read_vector<std::uint16_t>(file_.get(), pp + "/sparse_channels", H5T_NATIVE_UINT16, {total}, f);
      r.outlier_value = h5::read_vector<std::uint16_t>(file_.get(), pp + "/sparse_values", f16.get(), {total}, f);
      check_finite_f16(r.outlier_value, f, pp + "/sparse_values");
      for (std::size_t row = 0, e = 0; row < coded; ++row) {
        for (std::size_t first = e; e < r.outlier_end[row]; ++e) {
          const std::uint16_t c = r.outlier_channel[e];
          if (c >= d || (e > first && c <= r.outlier_channel[e - 1])) {
            throw CorruptData("a row's outlier channels must be ascending and < head_dim",
                              {f, pp + "/sparse_channels[" + std::to_string(e) + "]", std::to_string(c)});
          }
        }
      }
    }
  }
  p.set_nuq(t, std::move(r));
}

CacheBytes CacheReader::stored_bytes(std::size_t layer, std::size_t head) const {
  return stored_group_bytes(cache_head_path(layer, head));
}

CacheBytes CacheReader::stored_group_bytes(const std::string& path) const {
  auto size = [&](const std::string& p) -> std::uint64_t {
    if (!h5::link_exists(file_.get(), p)) return 0;
    h5::Dataset d = h5::open_dataset(file_.get(), p, path_);
    return h5::storage_bytes(d.get());
  };
  CacheBytes b;
  for (std::size_t s = 0; h5::link_exists(file_.get(), path + "/segments/" + std::to_string(s)); ++s) {
    b += stored_group_bytes(path + "/segments/" + std::to_string(s));
  }
  b.indices += size(path + "/kept");
  for (const char* part : kParts) {
    const std::string pp = path + "/" + part + "/";
    b.codes += size(pp + "codes") + size(pp + "blocks");
    b.scales += size(pp + "scale");
    b.zeros += size(pp + "zero");
    b.residual += size(pp + "residual");
    b.outliers += size(pp + "outlier_channels") + size(pp + "outlier_values");
    // nuq (version 6): its table and per-row offsets/ranges, f16 sink rows, sparse outliers.
    b.scales += size(pp + "levels") + size(pp + "upper") + size(pp + "lower") + size(pp + "offset") + size(pp + "range");
    b.residual += size(pp + "sink");
    b.outliers += size(pp + "sparse_values");
    b.indices += size(pp + "sparse_channels") + size(pp + "sparse_counts");
    if (h5::link_exists(file_.get(), pp + "blocks")) {  // an fp8 tensor's f32 scale, an attribute
      h5::Group pg(H5Gopen2(file_.get(), (path + "/" + part).c_str(), H5P_DEFAULT));
      if (h5::attr_exists(pg.get(), "fp8_scale")) b.scales += 4;
    }
  }
  return b;
}

}  // namespace akv
