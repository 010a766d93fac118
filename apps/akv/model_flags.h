#pragma once
// The flags of commands that load a model (dump, evaluate --model, bench decode).
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "akv/core/errors.h"
#include "akv/core/isa.h"
#include "akv/eval/perplexity.h"
#include "akv/io/token_file.h"
#include "akv/model/gguf.h"
#include "akv/model/model.h"
#include "akv/model/tokenizer.h"

namespace akv::cli {

inline constexpr const char* kModelHelp =
    "Model: a Hugging Face directory (config.json + safetensors), a GGUF file, or a llama2.c "
    "checkpoint (.bin) (docs/model.md)";

// --weights stored|f32 into `mode`.
inline void add_weights_flag(CLI::App* sub, std::string& mode) {
  sub->add_option("--weights", mode,
                  "stored: F16/BF16 and GGUF block weights stay as the file stores them (memory-mapped) "
                  "and are converted to f32 a tile at a time in each product; f32: converted on load "
                  "(4 bytes per weight; results equal within float rounding)")
      ->capture_default_str()->check(CLI::IsMember({"stored", "f32"}));
}

// The tokenizer for text inputs: --tokenizer (`bytes`, a SentencePiece model file or a
// tokenizer.json), else the model's own: tokenizer.model of a Hugging Face directory, else its
// tokenizer.json (byte-level BPE), config.json's "akv_tokenizer": "bytes", the vocabulary
// embedded in a GGUF file. Null when there is none.
inline std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& flag, const std::string& model_path,
                                                    const Model& m) {
  if (flag == "bytes") return std::make_unique<Tokenizer>(Tokenizer::bytes());
  if (!flag.empty()) return std::make_unique<Tokenizer>(flag);
  const auto sp = std::filesystem::path(model_path) / "tokenizer.model";
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec) && std::filesystem::is_regular_file(sp, ec)) {
    return std::make_unique<Tokenizer>(sp.string());
  }
  const auto tj = std::filesystem::path(model_path) / "tokenizer.json";
  if (std::filesystem::is_directory(model_path, ec) && std::filesystem::is_regular_file(tj, ec)) {
    return std::make_unique<Tokenizer>(tj.string());
  }
  if (m.config().tokenizer == "bytes") return std::make_unique<Tokenizer>(Tokenizer::bytes());
  if (is_gguf(model_path) && GgufFile(model_path).metadata().contains("tokenizer.ggml.model")) {
    return std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_path));
  }
  return nullptr;
}

// What a run of a model reads besides its own flags' files: the model path and, for a Hugging
// Face directory, every file in it (config.json, weights, the tokenizer found there), and the
// side files of each method (calibration=, budgets=). For check_output_distinct.
inline std::vector<std::string> model_run_inputs(const std::string& model_path, const std::vector<PplMethod>& methods) {
  std::vector<std::string> files{model_path};
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(model_path, ec)) {
      if (e.is_regular_file(ec)) files.push_back(e.path().string());
    }
  }
  for (const PplMethod& m : methods) {
    if (!m.params) continue;
    for (const std::string& f : m.params->input_files()) files.push_back(f);
  }
  return files;
}

// The arithmetic of a model run, for a part's params: the plain loops (--max-isa generic) sum
// in another order than the vector kernels (AVX2 and AVX-512 give the same bits), so parts of
// the two do not merge into one report.
inline const char* kernel_arithmetic() { return active_isa() == Isa::generic ? "generic" : "vector"; }

// --text FILE cut into llama-perplexity's chunks of `ctx` tokens (BOS first; at most max_chunks,
// 0 = all).
inline std::vector<std::vector<std::int32_t>> text_chunks(const std::string& path, const Tokenizer* tok,
                                                          std::size_t ctx, std::size_t max_chunks) {
  if (!tok) throw UsageError("--text needs a tokenizer (--tokenizer FILE, or one in the model)", {"", "--text"});
  std::vector<std::int32_t> ids;
  if (tok->bos() >= 0) ids.push_back(tok->bos());
  const std::vector<std::int32_t> body = tok->encode(read_text_file(path));
  ids.insert(ids.end(), body.begin(), body.end());
  return perplexity_chunks(std::move(ids), ctx, tok->bos(), max_chunks);
}

}  // namespace akv::cli
