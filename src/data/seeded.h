// Deterministic randomness shared by splits, the loader and augmentation: every draw is our own arithmetic on
// std::mt19937_64 (whose output the standard fixes), never a std:: distribution (whose algorithms vary between
// standard libraries), so results are identical on every platform.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

namespace vit {


// splitmix64 chain over the values: a well-spread seed for each (seed, epoch, position, ...) tuple.
uint64_t mix_seed(std::initializer_list<uint64_t> values);
// Uniform double in [0, 1) from the top 53 bits.
double uniform01(std::mt19937_64& rng);
// Uniform integer in [0, n), n > 0 (multiply-shift; bias below n / 2^64).
int64_t uniform_int(std::mt19937_64& rng, int64_t n);
// Fisher-Yates permutation of 0..n-1 driven by mt19937_64(seed).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

}  // namespace vit
