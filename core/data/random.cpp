// The seeded generator (Rng: splitmix64 seeding + xoshiro256**) and the augmentation of labelled
// images that draws from it (random crop of the zero-padded image, horizontal flip). The order of
// draws is part of the contract: a resumed run replays them bit for bit.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/base/error.hpp"
#include "core/data/dataset.hpp"

namespace vitlens {

// ---------------------------------------------------------------------------------------------
// Rng: splitmix64 seeding + xoshiro256** (https://prng.di.unimi.it/, the authors' reference C).
// ---------------------------------------------------------------------------------------------

namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& word : s) word = splitmix64(x);  // never all zero: splitmix64 is a bijection of distinct inputs
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int Rng::below(int n) {
  if (n <= 0) throw Error("Rng::below: n must be > 0, got " + std::to_string(n));
  // 2^64 mod n values at the top would make small results likelier: draw again when we land there.
  const uint64_t range = static_cast<uint64_t>(n);
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % range;
  uint64_t r = next();
  while (r >= limit) r = next();
  return static_cast<int>(r % range);
}

void Rng::shuffle(std::vector<int32_t>& v) {
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(below(static_cast<int>(i)));
    std::swap(v[i - 1], v[j]);
  }
}

void augment_crop_flip(const float* in, int height, int width, int pad, bool flip, Rng& rng, float* out) {
  if (height < 1 || width < 1 || pad < 0)
    throw Error("augment_crop_flip: bad size " + std::to_string(height) + "x" + std::to_string(width) + " pad " +
                std::to_string(pad));
  const int dy = rng.below(2 * pad + 1), dx = rng.below(2 * pad + 1);
  const bool mirrored = flip && rng.below(2) == 1;
  const size_t plane = static_cast<size_t>(height) * static_cast<size_t>(width);
  // The crop reads pixels the write would already have replaced when in == out: read a copy.
  std::vector<float> copy;
  if (in == out) {
    copy.assign(in, in + 3 * plane);
    in = copy.data();
  }
  // out[c][y][x] = padded[c][y + dy][x' + dx] with x' = W-1-x when mirrored, padded = in shifted by pad.
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < height; ++y) {
      const int sy = y + dy - pad;
      float* dst = out + static_cast<size_t>(c) * plane + static_cast<size_t>(y) * static_cast<size_t>(width);
      const bool row_inside = sy >= 0 && sy < height;
      const float* src = in + static_cast<size_t>(c) * plane + static_cast<size_t>(row_inside ? sy : 0) * static_cast<size_t>(width);
      for (int x = 0; x < width; ++x) {
        const int sx = (mirrored ? width - 1 - x : x) + dx - pad;
        dst[x] = row_inside && sx >= 0 && sx < width ? src[sx] : 0.0f;
      }
    }
}

}  // namespace vitlens
