#pragma once
// Ascending sorts of large arrays of doubles by their bits: an LSD radix sort (11-bit digits,
// a pass skipped when every value has the same digit; values that are all f32-exact, such as
// nuq's normalized rows, sort by 32-bit keys in three passes), for the k-means fits and
// quantiles of calibrate. Values must not be NaN.
#include <cstdint>
#include <vector>

namespace akv {

// x ascending (the same values std::sort leaves; among the equal ones only -0 and +0 are
// distinguishable, and -0 comes first here).
void sort_values(std::vector<double>& x);

// The indices of x in ascending order of value, equal values (-0 and +0 among them) by index:
// the order std::sort gives the pairs (x[i], i). x.size() < 2^32.
std::vector<std::uint32_t> stable_order(const std::vector<double>& x);

}  // namespace akv
