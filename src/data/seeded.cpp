// Deterministic randomness: splitmix64 seeds, uniform draws and permutations from std::mt19937_64.
#include "data/seeded.h"

#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace vit {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t mix_seed(std::initializer_list<uint64_t> values) {
  uint64_t hash = 0x6a09e667f3bcc909ull;
  for (uint64_t value : values) {
    uint64_t state = hash ^ value;
    hash = splitmix64(state);
  }
  return hash;
}

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int64_t uniform_int(std::mt19937_64& rng, int64_t n) {
  if (n <= 0) throw std::invalid_argument("uniform_int: empty range (n = " + std::to_string(n) + ")");
  return static_cast<int64_t>((static_cast<unsigned __int128>(rng()) * static_cast<uint64_t>(n)) >> 64);
}

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[uniform_int(rng, i + 1)]);
  return order;
}

}  // namespace vit
