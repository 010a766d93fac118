#pragma once
// The word lists of the RULER task generator (eval/ruler_tasks.h): common English adjectives,
// nouns, past-tense verbs and adverbs, written for this project. Keys are adjective-noun pairs;
// the essay haystack is sentences of a small grammar over them; cwe draws its words from all of
// them and then from adjective+noun compounds.
#include <string>
#include <vector>

namespace akv::ruler_words {

const std::vector<std::string>& adjectives();
const std::vector<std::string>& nouns();
const std::vector<std::string>& verbs();    // past tense
const std::vector<std::string>& adverbs();

}  // namespace akv::ruler_words
