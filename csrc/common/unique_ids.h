// Sorted distinct ids and each id's index among them (np.unique with
// return_inverse), in linear time: an LSD radix sort whose number of passes
// follows the largest id, so a batch of ids below 2^22 takes two passes.
#pragma once

#include <cstdint>
#include <vector>

namespace lsm {

// Fills `unique` (ascending) and inverse[i] = position of ids[i] in `unique`.
// Returns false, touching nothing, when an id is negative (the caller reports it).
bool unique_inverse(const int64_t* ids, int64_t n, std::vector<int64_t>& unique, int64_t* inverse);

}  // namespace lsm
