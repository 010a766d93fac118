// akv's named methods against outputs of their official implementations (data/golden, written by
// scripts/golden_official.py; docs/eviction.md, "Fidelity to the reference implementations").
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

const std::string kGolden = std::string(AKV_SOURCE_DIR) + "/data/golden/";

// Every method of a golden file: each head keeps as many tokens as the official code, and the
// same tokens except where the official scores tie at the head's cutoff (torch's sort and topk
// leave their order open; akv keeps the earliest).
void check_golden(const std::string& name) {
  std::ifstream in(kGolden + name);
  REQUIRE(in);
  const nlohmann::json g = nlohmann::json::parse(in);
  const DumpReader dump(kGolden + g["dump"].get<std::string>());
  for (const auto& [method, official] : g["methods"].items()) {
    EvictionParams p = eviction_method(method);
    p.budget_fraction = g["budget"].get<double>();
    p.score.window = g["window"].get<std::size_t>();
    const EvictionPlan plan = plan_eviction(dump, p, 1, {});
    const nlohmann::json& layers = official["layers"];
    REQUIRE(layers.size() == plan.heads.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      for (std::size_t h = 0; h < layers[l].size(); ++h) {
        const nlohmann::json& want = layers[l][h];
        const HeadPlan& mine = plan.heads[l][h];
        INFO(name << ": " << method << " (" << official["reference"].get<std::string>() << ") layer " << l
                  << " head " << h);
        CHECK(mine.tokens == want["budget"].get<std::size_t>());
        const auto kept = want["kept"].get<std::vector<std::int32_t>>();
        const auto tied = want["tied"].get<std::set<std::int32_t>>();
        std::vector<std::int32_t> differ;
        std::set_symmetric_difference(mine.kept.begin(), mine.kept.end(), kept.begin(), kept.end(),
                                      std::back_inserter(differ));
        for (std::int32_t t : differ) {
          INFO("position " << t << " kept by one side only");
          CHECK(tied.count(t) == 1);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("Ada-KV, SnapKV and PyramidKV keep what their official code keeps (GQA 4, 20%)", "[golden][alloc]") {
  // scripts/golden_official.py data/golden/gqa4-dump.h5 data/golden/gqa4-official.json
  //   --adakv ADAKV_CHECKOUT --kvcache-factory KVCACHE_FACTORY_CHECKOUT
  check_golden("gqa4-official.json");
}

TEST_CASE("H2O and StreamingLLM keep what their official code keeps (MHA, every prompt query, 25%)",
          "[golden][alloc]") {
  // scripts/golden_official.py data/golden/mha-dump.h5 data/golden/mha-official.json --budget 0.25
  //   --h2o H2O_CHECKOUT --streaming-llm STREAMING_LLM_CHECKOUT
  check_golden("mha-official.json");
}
