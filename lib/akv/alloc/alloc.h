#pragma once
// Token-budget allocators across KV heads (and layers). They work on the selectable tokens of
// each head - all tokens except the forced ones (observation window and sinks), whose count is
// the same for every head and is added by the caller - and return how many selectable tokens
// each head keeps ("extra" capacity). Every allocator returns integers that sum exactly to the
// requested total, with 0 <= c_h <= available_h; ties are broken by the lower head index, so
// results are deterministic.
//
// `sorted[h]` holds head h's selection scores of its selectable tokens, sorted in descending
// order (its length is available_h).
#include <cstddef>
#include <vector>

#include "akv/method/eviction_params.h"

namespace akv {

using SortedScores = std::vector<std::vector<double>>;

// Same extra capacity for every head (clamped to what it has; the rest goes to heads with room,
// by their next best score).
std::vector<std::size_t> allocate_uniform(const SortedScores& sorted, std::size_t base);

// Ada-KV: base per head; the top H*base scores of all heads flattened (ties: lower head, then
// higher rank) decide count_h; then, by `rule` (CapacityRule in method/eviction_params.h):
//   official:    capacity_h = round(f32(f32(count_h * f32(1 - alpha)) + int(alpha*base))), ties
//                to even, as FFY0/AdaKV's update_kv_gqa (torch f32 arithmetic, torch.round);
//                nothing is evicted when base exceeds what the heads have (official: base >
//                prefix length). Totals may fall short of H*base by rounding.
//   exact_total: alpha*base + (1 - alpha)*count_h, made integer by largest remainder so the
//                total is exactly H*base; every head keeps >= floor(alpha*base) (or all it has).
//   kvpress:     kvpress's AdaKVPress: each head keeps n_kept = base + forced tokens on average;
//                it protects its int(n_kept * alpha) best (Python's truncation of the double
//                product; its `forced` tokens, which kvpress's scorers rank first, among them),
//                then the layer's other H*base - protected places go to the best unprotected
//                scores of all heads (ties: lower head, then higher rank). Totals are exactly
//                H*base; nothing is evicted when the heads have no more than that.
// Each rule is computed in exact or explicitly rounded arithmetic, independent of compiler
// flags (no contraction of multiply-adds can change a capacity). Applied to the heads of one
// layer (adakv) or of all layers (adakv-global).
// `forced`: tokens every head keeps beside its selectable ones (the kvpress rule counts them).
std::vector<std::size_t> allocate_adakv(const SortedScores& sorted, std::size_t base, double alpha,
                                        CapacityRule rule = CapacityRule::official, std::size_t forced = 0);
// Plain reference: full sort of the flattened scores, same capacity rule.
std::vector<std::size_t> allocate_adakv_ref(const SortedScores& sorted, std::size_t base,
                                            double alpha, CapacityRule rule = CapacityRule::official,
                                            std::size_t forced = 0);
// DuoAttention's head split (retrieval heads keep everything, streaming heads their forced sinks
// and recent tokens) over the heads given (every head of every layer, flattened): a head's score
// is its best selectable score (the front of its sorted list; a head without any ranks last); the
// r best heads (ties: the lower index) keep all their selectable tokens, the others none.
// r = round(H * base / n), n the selectable tokens of a head (the most any head has), so the
// total is H * base within half a head's tokens. `head_scores` [H], when given, rank the heads
// instead (a calibrated pattern; the same ties).
std::vector<std::size_t> allocate_duo(const SortedScores& sorted, std::size_t base,
                                      const std::vector<double>* head_scores = nullptr);

// The kvpress rule's protected selectable tokens of a head that has `selectable` of them:
// int((base + forced) * alpha) less its forced tokens.
std::size_t kvpress_protected(std::size_t base, std::size_t forced, double alpha, std::size_t selectable);
// The official rule for one head: round half to even of f32(f32(count * f32(1 - alpha)) +
// f32(floor_capacity)), each f32 operation correctly rounded.
std::size_t official_capacity(std::size_t count, double alpha, std::size_t floor_capacity);

// Greedy marginal-utility water-filling (Ada-KV article): every head starts at min_tokens;
// then `step` tokens at a time go to the head whose next step adds the most score (utility of
// head h at c tokens = sum of its c best scores). The last award may be smaller than `step`.
// Total extra = `total`. On sorted (concave) utilities this is optimal for step 1.
std::vector<std::size_t> allocate_waterfill(const SortedScores& sorted, std::size_t total,
                                            std::size_t min_tokens, std::size_t step);

// PyramidKV per-layer budgets: layer l of L gets max - l*(max - min)/(L - 1) extra tokens per
// head, min = base/beta, max = 2*base - min (so the mean is base), made integer by largest
// remainder so the sum over layers is exactly L*base; each value clamped to `cap` with the
// excess moved to the layers with room, lowest layer first.
std::vector<std::size_t> pyramid_layer_budgets(std::size_t n_layers, std::size_t base,
                                               double beta, std::size_t cap);
// The official schedule (KVCache-Factory's PyramidKVCluster, FFY0/AdaKV's pyram mode): min =
// floor(base / beta), max = 2*base - min; when max >= cap (the tokens before the window): max =
// cap, min = 2*base - max; step = (max - min) / (L - 1) in integer division; layer l keeps
// max - l*step. The layers keep at least L*base in all (the truncated step leaves the later
// layers higher); a single layer keeps base.
std::vector<std::size_t> pyramid_layer_budgets_official(std::size_t n_layers, std::size_t base,
                                                        double beta, std::size_t cap);

// Sum of the c best scores of each head: the utility a capacity vector retains.
double retained_utility(const SortedScores& sorted, const std::vector<std::size_t>& capacity);

// Integer parts of non-negative reals whose sum is exactly `total` (largest remainder; ties to
// the lower index). The reals must sum to `total` up to rounding.
std::vector<std::size_t> largest_remainder(const std::vector<double>& real, std::size_t total);

}  // namespace akv
