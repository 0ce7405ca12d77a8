// llmc/precision/fp4_rng.cuh: the counter-based random numbers of stochastic rounding and of random Hadamard signs,
// compiled on the host and the device (the kernels and their references draw the same bits): Philox4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; checked against the Random123 known-answer
// vectors in test/precision/test_fp4_ref.cpp), and how a quantiser keys it. A random number is a pure function of
// (seed, step, tensor, element index), so results are reproducible, resume bit for bit and do not depend on the
// launch shape.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace llmc {

struct Philox4 {
  uint32_t v[4];
};

// Philox4x32 with 10 rounds: counter (c0..c3), key (k0, k1) -> four independent 32-bit words.
__host__ __device__ inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                 uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl) increments
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// What a stochastic rounding draws from: the run's seed, the optimizer step, and a number naming the tensor (the
// caller's: e.g. layer * kinds + kind), so two tensors or two steps never share a stream.
struct StochasticKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t tensor = 0;
};

// The 16 random bits of element `index` of one output copy (copy 0: the row-wise codes, 1: the transposed codes):
// Philox4x32-10 with key (seed low, seed high) and counter (index / 8 low, (index / 8 high) | copy << 31, step,
// tensor); element index % 8 takes word (index % 8) / 2, its low half for an even index and its high half for an odd
// one. One Philox call serves eight consecutive elements (random_words8, then random_half).
__host__ __device__ inline Philox4 random_words8(const StochasticKey& key, uint64_t index, int copy) {
  const uint64_t group = index >> 3;
  return philox4x32_10(static_cast<uint32_t>(group),
                       static_cast<uint32_t>(group >> 32) | (static_cast<uint32_t>(copy & 1) << 31), key.step,
                       key.tensor, static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32));
}
// Element k (0..7) of a group's 16-bit draws, in the low 16 bits. Selects, not an indexed load: where k is known
// only at run time the words stay in registers; where it is a constant the selects fold away.
__host__ __device__ inline uint32_t random_half(const Philox4& words, int k) {
  const uint32_t w = (k & 4) ? ((k & 2) ? words.v[3] : words.v[2]) : ((k & 2) ? words.v[1] : words.v[0]);
  return (k & 1) ? w >> 16 : w & 0xFFFFu;
}
__host__ __device__ inline uint32_t random_bits16(const StochasticKey& key, uint64_t index, int copy) {
  return random_half(random_words8(key, index, copy), static_cast<int>(index & 7));
}

// A vector of `n` <= 32 random signs (bit i set: element i is negated) for a random Hadamard transform, drawn from
// the seed alone (step and tensor as given: the NVFP4 recipe keeps one vector for the whole run and every layer).
// Counter (0, 0x40000000: a range no element index reaches, step, tensor).
__host__ __device__ inline uint32_t random_signs(const StochasticKey& key, int n) {
  const uint32_t w = philox4x32_10(0u, 0x40000000u, key.step, key.tensor, static_cast<uint32_t>(key.seed),
                                   static_cast<uint32_t>(key.seed >> 32)).v[0];
  return n >= 32 ? w : (w & ((1u << n) - 1u));
}

}  // namespace llmc
