// The sampler's randomness: one splitmix64 stream per (seed, iteration, hop,
// node). The Triton sampler (lsm_gnn/kernels/sampler.py) draws from the very
// same streams, so the CPU and GPU hops are identical.
// Plain C++ with LSM_HD (from line_state.h) so g++ and nvcc both compile it.
#pragma once

#include <cstdint>

#include "cache/line_state.h"  // LSM_HD, mix64

namespace lsm::sampler {

using lsm::cache::mix64;

// Key of one mini-batch; hop h of it uses hop_key(batch, h).
LSM_HD uint64_t batch_key(uint64_t seed, int64_t iteration) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(iteration)));
}
LSM_HD uint64_t hop_key(uint64_t batch, uint64_t hop) { return mix64(batch + hop); }

// A splitmix64 stream; `bounded` uses Lemire's multiply-shift (bias < 2^-32 for our sizes).
struct Stream {
  uint64_t state;

  static LSM_HD Stream for_node(uint64_t hop, int64_t node) { return Stream{hop ^ mix64(static_cast<uint64_t>(node))}; }
  LSM_HD uint64_t next() { return mix64(state += 0x9E3779B97F4A7C15ull); }
  LSM_HD uint64_t bounded(uint64_t n) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(next(), n);  // the high 64 bits of the 128-bit product, as on the host
#else
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
#endif
  }
};

// Neighbors a node with `degree` neighbors contributes at fanout k (-1: all).
LSM_HD int64_t sample_count(int64_t degree, int64_t k) { return (k < 0 || degree <= k) ? degree : k; }

// Floyd's algorithm: writes k distinct positions in [0, degree) to out.
// Only for 0 <= k < degree; a node that takes all neighbors draws nothing.
LSM_HD void floyd_sample(Stream& rng, int64_t degree, int64_t k, int64_t* out) {
  int64_t count = 0;
  for (int64_t j = degree - k; j < degree; ++j) {
    const int64_t r = static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(j) + 1));
    bool taken = false;
    for (int64_t c = 0; c < count; ++c) taken |= (out[c] == r);
    out[count++] = taken ? j : r;
  }
}

}  // namespace lsm::sampler
