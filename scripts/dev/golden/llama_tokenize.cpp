// llama.cpp's token ids for the texts of stdin (one per line, hex-encoded UTF-8), one JSON list per
// line: llama_tokenize with add_special false and parse_special false (as llama-perplexity
// tokenizes its text). Built and run by scripts/dev/golden/gemma_gguf_ids.sh against a llama.cpp
// build; outside akv's build.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: llama_tokenize MODEL.gguf < hex-lines\n");
    return 2;
  }
  llama_backend_init();
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::string line;
  while (std::getline(std::cin, line)) {
    std::string text;
    for (std::size_t i = 0; i + 1 < line.size(); i += 2) text += static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16));
    std::vector<llama_token> ids(text.size() + 8);
    const int n = llama_tokenize(vocab, text.data(), static_cast<int>(text.size()), ids.data(), static_cast<int>(ids.size()),
                                 false, false);
    if (n < 0) return 1;
    std::printf("[");
    for (int i = 0; i < n; ++i) std::printf(i ? ", %d" : "%d", ids[i]);
    std::printf("]\n");
  }
  llama_model_free(model);
  return 0;
}
