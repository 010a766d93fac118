#include "akv/method/ggml_params.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "akv/core/errors.h"
#include "akv/tensor/turboquant.h"

namespace akv {

const std::vector<std::string>& ggml_cache_type_names() {
  static const std::vector<std::string> names = {"f16",   "q8_0",  "q4_0",  "q4_1",     "q5_0",     "q5_1",
                                                 "iq4_nl", "fp8_e4m3", "fp8_e5m2", "tq2", "tq3", "tq4",
                                                 "tq2nc", "tq3nc", "tq4nc", "tq2j", "tq3j", "tq4j",
                                                 "tqv2", "tqv3", "tqv4"};
  return names;
}

const std::vector<std::string>& ggml_cache_type_words() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w = ggml_cache_type_names();
    w.insert(w.end(), {"e4m3", "e5m2"});
    return w;
  }();
  return words;
}

std::string ggml_cache_type_alias(const std::string& word) {
  return word == "e4m3" || word == "e5m2" ? "fp8_" + word : word;
}

const std::vector<std::string>& fp8_scale_names() {
  static const std::vector<std::string> names = {"head", "tensor", "one"};
  return names;
}

namespace {

// A tq* name's kind and bits (head_dim 0), nullopt for other names.
std::optional<TqType> tq_cache_type(const std::string& name) {
  if (name.rfind("tq", 0) != 0) return std::nullopt;
  const bool value = name.rfind("tqv", 0) == 0, nc = name.size() > 2 && name.substr(name.size() - 2) == "nc";
  const bool qjl = name.back() == 'j';
  const std::string digits = name.substr(value ? 3 : 2, name.size() - (value ? 3 : 2) - (nc ? 2 : qjl ? 1 : 0));
  return TqType{value ? TqKind::value : nc ? TqKind::key_nc : qjl ? TqKind::key_qjl : TqKind::key, std::stoi(digits), 0};
}

// InvalidInput naming `file` and `field` unless name is a cache type of ggml_cache_type_names.
void check_ggml_cache_type_name(const std::string& name, const std::string& file, const std::string& field) {
  const auto& names = ggml_cache_type_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw InvalidInput("not a KV cache type akv stores (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, fp8_e4m3, fp8_e5m2, "
                       "tq2-4, tq2nc-4nc, tq2j-4j, tqv2-4)",
                       {file, field, name});
  }
}

}  // namespace

HeadType parse_head_type(const std::string& text, const std::string& file, const std::string& field) {
  const std::size_t plus = text.find('+');
  HeadType t{text.substr(0, plus), std::nullopt};
  check_ggml_cache_type_name(t.name, file, field);
  if (plus != std::string::npos) {
    const std::string r = text.substr(plus + 1);
    if (r != "hadamard" && r != "random") {
      throw InvalidInput("a per-head type's rotation is +hadamard or +random", {file, field, text});
    }
    t.rotate = parse_rotation(r, file, field);
  }
  return t;
}

std::vector<std::string> parse_cache_types(const std::string& text, char sep, const std::string& field) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t end = std::min(text.find(sep, at), text.size());
    const std::string t = text.substr(at, end - at);
    if (t.empty()) throw InvalidInput(std::string("an empty cache type in the list (separated by ") + sep + ")", {"", field, text});
    parse_head_type(t, "", field);
    if (std::find(out.begin(), out.end(), t) != out.end()) throw InvalidInput("a cache type listed twice", {"", field, t});
    out.push_back(t);
    if (end == text.size()) return out;
    at = end + 1;
  }
}

const GgmlTypeInfo& ggml_cache_type(const std::string& name, std::size_t head_dim, const std::string& file,
                                    const std::string& field) {
  check_ggml_cache_type_name(name, file, field);
  if (auto t = tq_cache_type(name)) {  // a row of head_dim values is one block
    t->head_dim = head_dim;
    if (const GgmlTypeInfo* info = tq_type_info(*t)) return *info;
    throw InvalidInput("TurboQuant cache types need head_dim a power of two from 8 to 512 (" + name + ")",
                       {file, field, std::to_string(head_dim)});
  }
  // llama.cpp's lower-case names; ggml_blocks.h knows the types by their upper-case names.
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return *ggml_type_info_by_name(upper);
}

void check_ggml_head_dim(const GgmlTypeInfo& type, std::size_t head_dim, const std::string& file,
                         const std::string& field) {
  if (head_dim % type.block != 0) {
    throw InvalidInput("head_dim must be a multiple of the cache type's block (" + std::to_string(type.block) + ")",
                       {file, field, std::to_string(head_dim)});
  }
}

GgmlCacheParams GgmlCacheParams::from_json(const nlohmann::json& j, const std::string& file) {
  GgmlCacheParams p;
  if (j.contains("types")) {
    p.types = j.at("types").get<std::string>();
    p.key.clear();
    p.value.clear();
    if (j.contains("head_types")) {
      const nlohmann::json& t = j.at("head_types");
      if (!t.is_array()) throw CorruptData("head_types is not a list", {file, "params.ggml.head_types"});
      for (std::size_t i = 0; i < t.size(); ++i) {
        const std::string at = "params.ggml.head_types[" + std::to_string(i) + "]";
        if (!t[i].is_array() || t[i].size() != 2 || !t[i][0].is_string() || !t[i][1].is_string()) {
          throw CorruptData("head_types entries are [key type, value type]", {file, at, t[i].dump().substr(0, 40)});
        }
        p.head_types.emplace_back(t[i][0].get<std::string>(), t[i][1].get<std::string>());
        parse_head_type(p.head_types.back().first, file, at);
        parse_head_type(p.head_types.back().second, file, at);
      }
    }
  } else {
    p.key = j.at("k").get<std::string>();
    p.value = j.at("v").get<std::string>();
    check_ggml_cache_type_name(p.key, file, "params.ggml.k");
    check_ggml_cache_type_name(p.value, file, "params.ggml.v");
  }
  if (p.fp8()) {
    p.scale = j.at("scale").get<std::string>();
    const auto& names = fp8_scale_names();
    if (std::find(names.begin(), names.end(), p.scale) == names.end()) {
      throw InvalidInput("unknown fp8 scale rule (head, tensor, one)", {file, "params.ggml.scale", p.scale});
    }
    p.calibration = j.value("calibration", "");
  }
  if (j.contains("boundary")) {
    const nlohmann::json& b = j.at("boundary");
    if (!b.is_number_unsigned() || b.get<std::uint64_t>() > 100000) {
      throw InvalidInput("boundary must be a layer count from 0 to 100000", {file, "params.ggml.boundary", b.dump()});
    }
    p.boundary = b.get<std::size_t>();
  }
  return p;
}

}  // namespace akv
