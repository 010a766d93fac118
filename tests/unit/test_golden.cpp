// akv's named methods against outputs of their official implementations (data/golden, written by
// the scripts named in each file; docs/eviction.md, "Fidelity").
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "akv/alloc/eviction.h"
#include "akv/io/dump.h"

using namespace akv;

namespace {

nlohmann::json golden(const std::string& name) {
  std::ifstream in(std::string(AKV_SOURCE_DIR) + "/data/golden/" + name);
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("Ada-KV, SnapKV and PyramidKV keep what their official code keeps (GQA 4, 20%, window 32)",
          "[golden][alloc]") {
  // scripts/golden_adakv.py ADAKV_CHECKOUT data/golden/gqa4-dump.h5 data/golden/gqa4-official.json
  //   --kvcache-factory KVCACHE_FACTORY_CHECKOUT
  const nlohmann::json g = golden("gqa4-official.json");
  const DumpReader dump(std::string(AKV_SOURCE_DIR) + "/data/golden/" + g["dump"].get<std::string>());
  for (const char* method : {"adakv", "snapkv", "pyramid"}) {
    EvictionParams p = eviction_method(method);
    p.budget_fraction = g["budget"].get<double>();
    p.score.window = g["window"].get<std::size_t>();
    const EvictionPlan plan = plan_eviction(dump, p, 1, {});
    const nlohmann::json& layers = g["methods"][method]["layers"];
    REQUIRE(layers.size() == plan.heads.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      for (std::size_t h = 0; h < layers[l].size(); ++h) {
        const nlohmann::json& official = layers[l][h];
        const HeadPlan& mine = plan.heads[l][h];
        INFO(method << " layer " << l << " head " << h);
        CHECK(mine.tokens == official["budget"].get<std::size_t>());
        // The same tokens, except where the official scores tie at the cutoff (torch's sort
        // leaves their order open; akv keeps the earliest).
        const auto want = official["kept"].get<std::vector<std::int32_t>>();
        const auto tied = official["tied"].get<std::set<std::int32_t>>();
        std::vector<std::int32_t> differ;
        std::set_symmetric_difference(mine.kept.begin(), mine.kept.end(), want.begin(), want.end(),
                                      std::back_inserter(differ));
        for (std::int32_t t : differ) {
          INFO("position " << t << " kept by one side only");
          CHECK(tied.count(t) == 1);
        }
      }
    }
  }
}
