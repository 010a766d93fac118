// akv synth -o FILE [...]: a synthetic dump with the structure of real LLM caches.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <cstdio>

#include "akv/core/progress.h"
#include "akv/io/json_file.h"
#include "akv/synth/synth.h"
#include "commands.h"

namespace akv::cli {

void register_synth(CLI::App& app, const GlobalOptions& global) {
  struct Options {
    std::string output;
    SynthOptions synth;
    std::string dtype = "f16";
    std::string profile = "mixed";
    std::string rope_layout = "rotate-half";
    bool json = false;
  };
  auto opt = std::make_shared<Options>();
  SynthOptions& s = opt->synth;
  CLI::App* sub = app.add_subcommand(
      "synth",
      "Write a synthetic dump with local, retrieval and diffuse heads\n"
      "Write a synthetic dump (format akv-dump v1): keys with outlier channels and RoPE, values, "
      "window queries, and local / retrieval / diffuse heads whose attention patterns come from "
      "q.k. Deterministic for a given --seed on any thread count. See docs/synth.md.");
  sub->add_option("-o,--output", opt->output, "Output dump (HDF5)")->required();
  sub->add_option("--layers", s.n_layers, "Layers")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->add_option("--heads", s.n_heads, "Query heads (a multiple of --kv-heads)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_option("--kv-heads", s.n_kv_heads, "Key/value heads")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sub->add_option("--head-dim", s.head_dim, "Head dimension (even, >= 8)")->capture_default_str()
      ->check(CLI::Range(8, 1024));
  sub->add_option("--tokens", s.n_tokens, "Context length in tokens")->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--window", s.window,
                  "Observation window: queries of the last N positions are stored")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  sub->add_option("--dtype", opt->dtype, "Storage type of the tensors")->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32", "bf16"}));
  sub->add_option("--seed", s.seed, "Random seed")->capture_default_str();
  sub->add_option("--profile", opt->profile,
                  "Head kinds: mixed (local, retrieval and diffuse heads in every layer), local, "
                  "retrieval, diffuse, or gaussian (unstructured i.i.d. normal tensors)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mixed", "local", "retrieval", "diffuse", "gaussian"}));
  sub->add_option("--rope-theta", s.rope_theta, "RoPE base")->capture_default_str();
  sub->add_option("--rope-layout", opt->rope_layout, "RoPE pair layout")->capture_default_str()
      ->check(CLI::IsMember({"rotate-half", "interleaved"}));
  sub->add_option("--sinks", s.sinks, "Attention-sink tokens at the start")->capture_default_str();
  sub->add_option("--needles", s.needles, "Needle tokens that retrieval heads attend to")
      ->capture_default_str();
  sub->add_option("--outlier-channels", s.outlier_channels,
                  "Key outlier channels per head (0 = max(1, head_dim/32))")->capture_default_str();
  sub->add_option("--model", s.model, "Model name recorded in the dump")->capture_default_str();
  sub->add_flag("--pre-rope", s.write.key_pre_rope, "Also store keys before RoPE (key_pre_rope)");
  sub->add_option("--gzip", s.write.gzip, "Deflate level 0-9 (0 = uncompressed)")
      ->capture_default_str()->check(CLI::Range(0, 9));
  sub->add_flag("--json", opt->json, "Print the summary as JSON");
  sub->callback([opt, &global] {
    SynthOptions so = opt->synth;
    so.write.dtype = parse_dtype(opt->dtype);
    so.profile = parse_synth_profile(opt->profile);
    so.rope_layout = parse_rope_layout(opt->rope_layout);
    so.threads = global.threads;
    ProgressBar bar("synth", !global.quiet);
    auto t0 = std::chrono::steady_clock::now();
    SynthSummary sum = write_synth_dump(opt->output, so, bar.callback());
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double mb = static_cast<double>(sum.bytes_on_disk) / 1e6;
    nlohmann::json j = {{"format", "akv-synth"},
                        {"version", 1},
                        {"file", opt->output},
                        {"profile", opt->profile},
                        {"seed", so.seed},
                        {"bytes_on_disk", sum.bytes_on_disk},
                        {"seconds", secs},
                        {"mb_per_s", secs > 0 ? mb / secs : 0.0},
                        {"needles", sum.plan.needles}};
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& kinds : sum.plan.kinds) {
      nlohmann::json row = nlohmann::json::array();
      for (HeadKind k : kinds) row.push_back(head_kind_name(k));
      layers.push_back(row);
    }
    j["head_kinds"] = layers;
    if (opt->json) {
      std::fputs(json_text(j).c_str(), stdout);
      return;
    }
    std::string out = fmt::format("wrote {} ({:.1f} MB in {:.2f} s, {:.0f} MB/s)\n", opt->output,
                                  mb, secs, secs > 0 ? mb / secs : 0.0);
    for (std::size_t l = 0; l < sum.plan.kinds.size(); ++l) {
      std::string kinds;
      for (HeadKind k : sum.plan.kinds[l]) kinds += (kinds.empty() ? "" : " ") + head_kind_name(k);
      out += fmt::format("  layer {:>3}: {}\n", l, kinds);
    }
    std::string needles;
    for (auto p : sum.plan.needles) needles += (needles.empty() ? "" : " ") + std::to_string(p);
    out += fmt::format("  needles: {}\n", needles.empty() ? "none" : needles);
    std::fputs(out.c_str(), stdout);
  });
}

}  // namespace akv::cli
