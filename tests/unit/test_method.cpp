#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <string>

#include "akv/core/errors.h"
#include "akv/method/eviction_params.h"
#include "akv/method/params.h"
#include "akv/method/registry.h"

using namespace akv;

TEST_CASE("registry: every method has a kind that resolution accepts", "[method]") {
  for (const MethodInfo& m : method_registry()) {
    CompressRequest r;
    r.method = m.name;
    switch (m.kind) {
      case MethodKind::quantizer:
      case MethodKind::preset:
      case MethodKind::tiered:
        if (std::string(m.name) == "nuq") r.calibration = "calib.json";  // its codebooks, read when it runs
        CHECK_NOTHROW(resolve_params(r));
        break;
      case MethodKind::eviction:
        r.eviction.budget = 0.5;
        if (std::string(m.name) == "qfilter") r.eviction.qfilters = "calib.json";  // read when it runs
        if (std::string(m.name) == "kvzap") r.eviction.surrogate = "calib.json";
        CHECK(resolve_params(r).eviction() != nullptr);
      {
        const EvictionParams e = eviction_method(m.name);
        CHECK(eviction_method_name(e.score.method, e.alloc, e.critical) == m.name);
        break;
      }
      case MethodKind::joint:
        CHECK(is_eviction_method(m.name));
        CHECK(eviction_method_name(ScoreMethod::snapkv, AllocMethod::joint) == "joint");
        break;
      case MethodKind::ggml:
        CHECK(resolve_params(r).ggml() != nullptr);
        break;
      case MethodKind::reference:  // model runs take it; no cache file is made of it
        CHECK(std::string(m.name) == kFullMethod);
        CHECK_FALSE(resolve_method_spec(m.name).has_value());
        CHECK_THROWS_AS(resolve_params(r), InvalidInput);
        break;
    }
  }
  // Every eviction method of the planner's table is in the registry, and nothing else is.
  for (const std::string& name : eviction_method_names()) {
    const MethodInfo* m = find_method(name);
    REQUIRE(m != nullptr);
    CHECK((m->kind == MethodKind::eviction || m->kind == MethodKind::joint));
  }
  CHECK(find_method("gptq") == nullptr);
  const std::string all = method_list();
  for (const char* name : {"none", "kivi-2", "adakv-global", "joint", "tiered", "compact"}) {
    CHECK(all.find(name) != std::string::npos);
  }
  CHECK(method_list({MethodKind::preset}) == "kivi-2, kivi-4, k4v2, k4v3");
  CHECK(all.find(kFullMethod) == std::string::npos);  // what a cache file can be made with
  CHECK(alloc_method_list(", ") == "uniform, adakv, waterfill, pyramid, adakv-pyramid, adakv-global, duo");
}

TEST_CASE("registry: method specs parse through the parameter table", "[method]") {
  const CompressRequest r = parse_method_spec("adakv:budget=0.2:quant=k4v2:window=16:pool=avg:pre-rope");
  CHECK(r.method == "adakv");
  CHECK(*r.eviction.budget == 0.2);
  CHECK(*r.quant == "k4v2");
  CHECK(*r.eviction.window == 16);
  CHECK(*r.eviction.pool == "avg");
  CHECK(r.pre_rope);
  const CompressRequest t = parse_method_spec("tiered:preset=k4v2:hot=256:cold-bits=16:demotion=fifo");
  CHECK(*t.tiered.cold_bits == 16);
  CHECK(*t.tiered.demotion == "fifo");
  // Malformed: usage errors (exit 1); out of range or not among the choices: invalid input (exit 2).
  CHECK_THROWS_AS(parse_method_spec("kivi:bogus=1"), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi:bits="), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi:"), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi::bits=2"), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi:bits=four"), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi:pre-rope=1"), UsageError);
  CHECK_THROWS_AS(parse_method_spec("kivi:bits=5"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("kivi:group=0"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("kivi:outlier-fraction=1"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("adakv:budget=0"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("adakv:budget=nan"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("adakv:pool=mean"), InvalidInput);
  CHECK_THROWS_AS(parse_method_spec("tiered:cold-bits=5"), InvalidInput);
  CHECK_NOTHROW(parse_method_spec("adakv:budget=1"));
  try {
    parse_method_spec("kivi:bits=5");
    FAIL("bits=5 was accepted");
  } catch (const InvalidInput& e) {
    CHECK(e.where().field == "kivi:bits=5: bits");
    CHECK(e.where().value == "5");
    CHECK(std::string(e.what()).find("2, 3, 4 or 8") != std::string::npos);
  }
}

TEST_CASE("registry: a spec as the method joins the request's flags", "[method]") {
  CompressRequest r;
  r.method = "adakv:budget=0.2:quant=k4v2:pre-rope";
  r.eviction.window = 16;
  join_method_spec(r);
  CHECK(r.method == "adakv");
  CHECK(r.eviction.budget == 0.2);
  CHECK(r.quant == "k4v2");
  CHECK(r.pre_rope);
  CHECK(r.eviction.window == 16);
  CompressRequest plain;
  plain.method = "kivi-2";
  plain.bits = 4;
  join_method_spec(plain);
  CHECK(plain.method == "kivi-2");
  CHECK(plain.bits == 4);
  for (const char* twice : {"kivi:bits=3", "kivi:pre-rope"}) {
    CompressRequest t;
    t.method = twice;
    t.bits = 4;
    t.pre_rope = true;
    CHECK_THROWS_AS(join_method_spec(t), UsageError);
  }
}

TEST_CASE("registry: requests built by a library caller get the same range checks", "[method]") {
  CompressRequest r;
  r.method = "kivi";
  r.bits_key = 5;
  CHECK_THROWS_AS(check_request(r), InvalidInput);
  CHECK_THROWS_AS(resolve_params(r), InvalidInput);
  r.bits_key = 4;
  r.eviction.alpha = 1.5;
  CHECK_THROWS_AS(check_request(r), InvalidInput);
  r.eviction.alpha.reset();
  r.tiered.decay = -0.1;
  CHECK_THROWS_AS(check_request(r), InvalidInput);
  r.tiered.decay.reset();
  CHECK_NOTHROW(check_request(r));
  const ParamInfo* b = find_param("budget");
  REQUIRE(b != nullptr);
  CHECK(param_range(*b) == "(0, 1]");
  CHECK(param_range(*find_param("outlier-fraction")) == "[0, 1)");
  CHECK(param_range(*find_param("calibration")).empty());
}

TEST_CASE("eviction fields: each row a registry parameter, set by its flag, kept by the JSON", "[method]") {
  // A value of each row unlike its default.
  const std::map<std::string, std::string> value = {
      {"kernel", "5"},     {"pool", "avg"},    {"gqa-reduce", "max"},   {"alpha", "0.35"},   {"beta", "7"},
      {"capacity-rule", "kvpress"},            {"min-tokens", "3"},     {"step", "2"},       {"future", "64"},
      {"covariance", "off"}, {"vnorm", "off"}, {"lag", "16"},           {"plus", "on"},      {"qfilters", "q.json"},
      {"surrogate", "s.json"}};
  CHECK(eviction_fields().size() == value.size());
  CHECK(allocator_flag_list() == "alpha, beta, capacity-rule, min-tokens, step");
  for (const EvictionField& f : eviction_fields()) {
    INFO(f.param);
    const ParamInfo* info = find_param(f.param);
    REQUIRE(info != nullptr);
    CHECK(info->scope == ParamScope::eviction);
    REQUIRE(value.count(f.param) == 1);
    // The registry's flag fills the request field the row reads.
    CompressRequest given;
    set_param(given, *info, value.at(f.param), std::string("--") + f.param);
    CHECK(std::visit([&](const auto& of) { return (given.eviction.*of.given).has_value(); }, f.field));
    const std::string base = "snapkv:budget=0.5:score=" + (f.score ? score_method_name(*f.score) : std::string("snapkv"));
    const std::string flag = std::string(":") + f.param + "=" + value.at(f.param);
    const std::string file = f.score == ScoreMethod::qfilter ? ":qfilters=other.json"
                             : f.score == ScoreMethod::kvzap ? ":surrogate=other.json"
                                                             : "";
    const nlohmann::json plain = resolve_params(parse_method_spec(base + file)).eviction()->to_json();
    const nlohmann::json j = resolve_params(parse_method_spec(base + flag)).eviction()->to_json();
    std::string key = f.param;
    std::replace(key.begin(), key.end(), '-', '_');
    CHECK(j != plain);
    CHECK(j.contains(key));
    CHECK(EvictionParams::from_json(j, "f.json").to_json() == j);
    if (f.score) {  // another score's flag
      CHECK_THROWS_WITH(resolve_params(parse_method_spec("snapkv:budget=0.5" + flag)), Catch::Contains("this flag"));
    } else if (f.allocator) {
      CHECK_THROWS_WITH(resolve_params(parse_method_spec("snapkv:threshold=0.1" + flag)),
                        Catch::Contains("threshold= replaces the allocator"));
    }
    if (f.absent) {  // files written before the key
      nlohmann::json old = j;
      old.erase(key);
      const nlohmann::json back = EvictionParams::from_json(old, "old.json").to_json();
      CHECK(back != j);
      CHECK(back.contains(key) != f.omit_absent);
    } else {
      nlohmann::json bad = j;
      bad.erase(key);
      CHECK_THROWS_AS(EvictionParams::from_json(bad, "bad.json"), CorruptData);
    }
  }
  // Files written before capacity_rule and plus were recorded: exact totals, plus off; a score's
  // parameters are in JSON only with that score.
  nlohmann::json old = resolve_params(parse_method_spec("adakv:budget=0.5")).eviction()->to_json();
  CHECK_FALSE(old.contains("lag"));
  old.erase("capacity_rule");
  CHECK(EvictionParams::from_json(old, "old.json").capacity_rule == CapacityRule::exact_total);
  const nlohmann::json kvzip = resolve_params(parse_method_spec("snapkv:budget=0.5:score=kvzip")).eviction()->to_json();
  CHECK_FALSE(kvzip.contains("plus"));
  CHECK_FALSE(EvictionParams::from_json(kvzip, "kvzip.json").score.plus);
}

TEST_CASE("resolved parameters: one mode at a time, from flags and from files", "[method]") {
  CompressRequest r;
  r.method = "balanced";
  const CompressParams t = resolve_params(r);
  CHECK(t.tiered() != nullptr);
  CHECK(t.eviction() == nullptr);
  r.method = "snapkv";
  r.eviction.budget = 0.3;
  const CompressParams e = resolve_params(r);
  CHECK(e.eviction() != nullptr);
  CHECK(e.tiered() == nullptr);
  CHECK(std::holds_alternative<QuantizeOnly>(resolve_params(parse_method_spec("kivi-2")).mode));
  // Round trip through the cache file's JSON keeps the mode.
  CHECK(CompressParams::from_json(t.to_json(), "t").tiered() != nullptr);
  CHECK(CompressParams::from_json(e.to_json(), "e").eviction() != nullptr);
  // A file that records both a tiered cache and an eviction is corrupt.
  nlohmann::json both = t.to_json();
  both["eviction"] = e.eviction()->to_json();
  CHECK_THROWS_AS(CompressParams::from_json(both, "both.h5"), CorruptData);
}

TEST_CASE("ggml method: llama.cpp cache types as k= and v=", "[method][ggml]") {
  const CompressParams p = resolve_params(parse_method_spec("ggml:k=q4_0:v=q8_0"));
  REQUIRE(p.ggml());
  CHECK(p.ggml()->key == "q4_0");
  CHECK(p.ggml()->value == "q8_0");
  CHECK(describe(p) == "ggml K q4_0 V q8_0");
  const CompressParams back = CompressParams::from_json(p.to_json(), "params.json");
  REQUIRE(back.ggml());
  CHECK(back.ggml()->key == "q4_0");
  CHECK(resolve_params(parse_method_spec("ggml")).ggml()->value == "f16");
  CHECK_THROWS_AS(parse_method_spec("ggml:k=q2_k"), InvalidInput);  // not among the choices
  CHECK_THROWS_AS(resolve_params(parse_method_spec("ggml:k=q4_0:bits=4")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("kivi:k=q4_0")), UsageError);
}

TEST_CASE("fp8 method: vLLM's 8-bit float types as ggml cache types, with a scale rule", "[method][ggml][fp8]") {
  const CompressParams p = resolve_params(parse_method_spec("fp8"));
  REQUIRE(p.ggml());
  CHECK(p.ggml()->key == "fp8_e4m3");
  CHECK(p.ggml()->value == "fp8_e4m3");
  CHECK(p.ggml()->scale == "head");
  CHECK(describe(p) == "ggml K fp8_e4m3 V fp8_e4m3 scale head");
  const CompressParams q = resolve_params(parse_method_spec("fp8:k=e4m3:v=e5m2:scale=tensor"));
  CHECK(q.ggml()->value == "fp8_e5m2");
  CHECK(q.to_json()["ggml"] == nlohmann::json({{"k", "fp8_e4m3"}, {"v", "fp8_e5m2"}, {"scale", "tensor"}}));
  const CompressParams back = CompressParams::from_json(q.to_json(), "params.json");
  CHECK(back.ggml()->scale == "tensor");
  CHECK(back.to_json() == q.to_json());
  // Mixed with llama.cpp's types through method ggml; other caches' JSON has no scale field.
  CHECK(resolve_params(parse_method_spec("ggml:k=q4_0:v=e5m2")).ggml()->value == "fp8_e5m2");
  CHECK_FALSE(resolve_params(parse_method_spec("ggml:k=q4_0")).to_json()["ggml"].contains("scale"));
  CHECK_THROWS_AS(resolve_params(parse_method_spec("fp8:k=q4_0")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("ggml:k=q4_0:scale=head")), UsageError);
  CHECK_THROWS_AS(parse_method_spec("fp8:scale=block"), InvalidInput);  // not among the choices
  nlohmann::json bad = q.to_json();
  bad["ggml"]["scale"] = "row";
  CHECK_THROWS_WITH(CompressParams::from_json(bad, "params.json"), Catch::Contains("params.ggml.scale = row"));
}

TEST_CASE("turboquant: vLLM's presets as ggml rows of TurboQuant types", "[method][ggml][turboquant]") {
  const CompressParams p = resolve_params(parse_method_spec("turboquant_k3v4_nc"));
  REQUIRE(p.ggml());
  CHECK(p.ggml()->key == "tq3nc");
  CHECK(p.ggml()->value == "tqv4");
  CHECK(p.rotate == RotationKind::hadamard);
  CHECK(describe(p) == "ggml K tq3nc V tqv4 hadamard boundary 2");
  CHECK(p.ggml()->boundary == 2);  // vLLM's boundary protection: first and last 2 layers f16
  CHECK(p.ggml()->boundary_layer(1, 32));
  CHECK_FALSE(p.ggml()->boundary_layer(2, 32));
  CHECK(p.ggml()->boundary_layer(30, 32));
  CHECK(p.ggml()->key_type(0, 0, 3, 2) == "f16");  // at most half of the layers each side: 0 and 2
  CHECK(p.ggml()->key_type(1, 1, 3, 2) == "tq3nc");
  CHECK(p.ggml()->value_type(2, 0, 3, 2) == "f16");
  CHECK(p.to_json()["ggml"]["boundary"] == 2);
  const CompressParams b0 = resolve_params(parse_method_spec("turboquant_k3v4_nc:boundary=0"));
  CHECK_FALSE(b0.to_json()["ggml"].contains("boundary"));
  CHECK_FALSE(b0.ggml()->boundary_layer(0, 32));
  CHECK_THROWS_AS(resolve_params(parse_method_spec("ggml:k=q4_0:boundary=2")), UsageError);
  // ggml-family caches store every row: no eviction over them.
  CHECK_THROWS_WITH(resolve_params(parse_method_spec("snapkv:budget=0.5:quant=turboquant_k3v4_nc")),
                    Catch::Contains("do not combine with eviction"));
  nlohmann::json badb = p.to_json();
  badb["ggml"]["boundary"] = -1;
  CHECK_THROWS_WITH(CompressParams::from_json(badb, "params.json"), Catch::Contains("params.ggml.boundary"));
  CHECK(CompressParams::from_json(p.to_json(), "params.json").to_json() == p.to_json());
  const CompressParams k8 = resolve_params(parse_method_spec("turboquant_k8v4"));
  CHECK(k8.ggml()->key == "fp8_e4m3");
  CHECK(k8.ggml()->scale == "one");
  CHECK(k8.rotate == RotationKind::none);  // vLLM's fp8 keys are not rotated
  CHECK(resolve_params(parse_method_spec("turboquant_4bit_nc")).to_json() ==
        resolve_params(parse_method_spec("turboquant:bits-key=4:bits-value=4")).to_json());
  CHECK(resolve_params(parse_method_spec("turboquant_3bit_nc")).ggml()->value == "tqv3");
  CHECK(resolve_params(parse_method_spec("turboquant")).to_json() == p.to_json());  // default 3 / 4
  CHECK(resolve_params(parse_method_spec("turboquant:bits-key=2:bits-value=2:rotate=random")).rotate == RotationKind::random);
  // The types without norm correction through method ggml.
  CHECK(resolve_params(parse_method_spec("ggml:k=tq3:v=tqv4:rotate=hadamard")).ggml()->key == "tq3");
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquant_k3v4_nc:bits-key=4")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquant:residual=32")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquant:bits-value=8")), InvalidInput);
  // types=FILE: per-head types (read against a shape later); k= / v= refused beside it.
  CompressParams typed = resolve_params(parse_method_spec("ggml:types=calib.json:rotate=hadamard"));
  REQUIRE(typed.ggml());
  CHECK(typed.ggml()->types == "calib.json");
  CHECK(describe(typed) == "ggml per-head types from calib.json hadamard");
  CHECK_THROWS_AS(resolve_params(parse_method_spec("ggml:types=calib.json:k=q4_0")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("fp8:types=calib.json")), UsageError);
  GgmlCacheParams g = *typed.ggml();
  g.head_types = {{"q4_0", "q8_0"}, {"fp8_e4m3", "tqv4"}, {"f16", "f16"}, {"tq3nc", "q4_0"}};  // 2 layers x 2 heads
  CHECK(g.key_type(0, 1, 2, 2) == "fp8_e4m3");
  CHECK(g.value_type(1, 1, 2, 2) == "q4_0");
  CHECK(g.fp8());
  typed.mode = g;
  const CompressParams h3 = typed.for_head(1, 1, 2);  // layer 1, head 1: one head's types
  CHECK(h3.ggml()->key == "tq3nc");
  CHECK(h3.ggml()->value == "q4_0");
  CHECK(h3.ggml()->head_types.empty());
  const nlohmann::json tj = typed.to_json();
  CHECK_FALSE(tj["ggml"].contains("k"));
  CHECK(tj["ggml"]["head_types"][1][0] == "fp8_e4m3");
  CHECK(CompressParams::from_json(tj, "params.json").to_json() == tj);
  nlohmann::json bad = tj;
  bad["ggml"]["head_types"][2] = {"q4_0"};
  CHECK_THROWS_WITH(CompressParams::from_json(bad, "params.json"), Catch::Contains("params.ggml.head_types[2]"));
  bad["ggml"]["head_types"][2] = {"q4_0", "q9_9"};
  CHECK_THROWS_WITH(CompressParams::from_json(bad, "params.json"), Catch::Contains("params.ggml.head_types[2]"));
  // qjl=on: TurboQuant_prod keys (bits-key - 1 levels + signs), method turboquant only.
  const CompressParams qjl = resolve_params(parse_method_spec("turboquant:bits-key=3:qjl=on"));
  CHECK(qjl.ggml()->key == "tq3j");
  CHECK(qjl.rotate == RotationKind::hadamard);
  CHECK(resolve_params(parse_method_spec("turboquant:qjl=off")).to_json() == p.to_json());
  CHECK(CompressParams::from_json(qjl.to_json(), "params.json").to_json() == qjl.to_json());
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquant_k3v4_nc:qjl=on")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquant:bits-key=8:qjl=on")), InvalidInput);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("ggml:k=q4_0:qjl=on")), UsageError);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("kivi:qjl=on")), UsageError);
  CHECK_THROWS_AS(parse_method_spec("turboquant:qjl=yes"), InvalidInput);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("turboquantx")), Error);  // an unknown name, not a preset
  // A TurboQuant row is one block of head_dim values: head_dim 96 has no layout.
  CHECK_THROWS_WITH(ggml_cache_type("tq3nc", 96, "", "k"), Catch::Contains("power of two"));
  CHECK(ggml_cache_type("tqv4", 64, "", "v").bytes == 36);
}

TEST_CASE("rotate: a parameter of every quantizer and of ggml, recorded in the parameters' JSON only when set",
          "[method][rotation]") {
  const CompressParams g = resolve_params(parse_method_spec("ggml:k=q4_0:v=q4_0:rotate=hadamard"));
  CHECK(g.rotate == RotationKind::hadamard);
  CHECK(describe(g) == "ggml K q4_0 V q4_0 hadamard");
  const CompressParams r = resolve_params(parse_method_spec("snapkv:budget=0.5:quant=kivi-2:rotate=random:rotate-seed=9"));
  CHECK(r.rotate == RotationKind::random);
  CHECK(r.rotate_seed == 9);
  CHECK(describe(r) == "uniform/snapkv 0.5 + kivi-2 K2/V2 R128 random-hadamard seed 9");
  const CompressParams back = CompressParams::from_json(r.to_json(), "params.json");
  CHECK(back.rotate == RotationKind::random);
  CHECK(back.rotate_seed == 9);
  CHECK(back.rotation(128, true) == Rotation{RotationKind::random, 128, 9});
  CHECK(back.rotation(128, false) == Rotation{RotationKind::random, 64, 9});
  const CompressParams plain = resolve_params(parse_method_spec("kivi-2"));
  CHECK_FALSE(plain.to_json().contains("rotate"));
  CHECK_FALSE(plain.rotation(128, true).active());
  CHECK_THROWS_AS(parse_method_spec("kivi-2:rotate=walsh"), InvalidInput);
  CHECK_THROWS_AS(resolve_params(parse_method_spec("snapkv:budget=0.5:rotate=hadamard")), UsageError);  // quant none
  nlohmann::json j = r.to_json();
  j["rotate"] = "spin";
  CHECK_THROWS_AS(CompressParams::from_json(j, "params.json"), CorruptData);
  j = r.to_json();
  j["pre_rope"] = true;
  CHECK_THROWS_AS(CompressParams::from_json(j, "params.json"), InvalidInput);
}
TEST_CASE("resolve_params: method defaults, presets and flag checks", "[method][params]") {
  CompressRequest r;
  CompressParams p = resolve_params(r);
  CHECK(p.method == Quantizer::kivi);
  CHECK(p.key.bits == 2);
  CHECK(p.value.bits == 2);
  CHECK(p.key.axis == QuantAxis::channel);
  CHECK(p.value.axis == QuantAxis::token);
  CHECK(p.key.group == 32);
  CHECK(p.residual == 128);
  r.method = "k4v3";
  p = resolve_params(r);
  CHECK(p.preset == "k4v3");
  CHECK(p.key.bits == 4);
  CHECK(p.value.bits == 3);
  r.method = "uniform";
  p = resolve_params(r);
  CHECK(p.key.bits == 4);
  CHECK(p.key.axis == QuantAxis::token);
  CHECK(p.residual == 0);
  r.bits = 3;
  CHECK(resolve_params(r).value.bits == 3);
  // JSON round trip.
  const CompressParams q = CompressParams::from_json(p.to_json(), "x");
  CHECK(q.to_json() == p.to_json());

  CompressRequest bad;
  bad.bits_key = 5;
  CHECK_THROWS_AS(resolve_params(bad), InvalidInput);
  bad = {};
  bad.group = 0;
  CHECK_THROWS_AS(resolve_params(bad), InvalidInput);
  bad = {};
  bad.residual = 100;  // not a multiple of 32
  CHECK_THROWS_AS(resolve_params(bad), InvalidInput);
  bad = {};
  bad.outlier_fraction = 1.0;
  CHECK_THROWS_AS(resolve_params(bad), InvalidInput);
  bad = {};
  bad.method = "uniform";
  bad.residual = 32;
  CHECK_THROWS_AS(resolve_params(bad), UsageError);
  bad = {};
  bad.method = "kivi-2";
  bad.bits_key = 4;
  CHECK_THROWS_AS(resolve_params(bad), UsageError);
  bad = {};
  bad.method = "none";
  bad.pre_rope = true;
  CHECK_THROWS_AS(resolve_params(bad), UsageError);
  bad = {};
  bad.method = "gptq";
  CHECK_THROWS_AS(resolve_params(bad), InvalidInput);
}

