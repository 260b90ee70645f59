// The AMX-BF16 kernel of bf16.hpp: a 16 x 48 tile of C as three 16 x 16 float32 tiles, each step
// of 16 pairs of k one A tile (16 rows x 16 pairs), three B tiles (16 pairs x 16 columns) and three
// TDPBF16PS. Written once as a template over the tile instructions, instantiated twice:
//   HardwareTiles  the instructions themselves (inline assembly: no target attribute needed, and
//                  each load and store tells the compiler it reads or writes memory);
//   SoftwareTiles  eight tile registers in memory and TDPBF16PS's arithmetic as Intel's manual
//                  states it (below), one element at a time: every CPU runs it, so the kernel's
//                  blocking, strides, tails and configuration are tested everywhere, and on a CPU
//                  with AMX the instructions are checked against it (gemm_bf16.cpp, the tests).
//
// TDPBF16PS, per element of C (Intel SDM vol. 2, "TDPBF16PS", Operation): two float32 sums start
// at zero, the even elements' products go to one and the odd elements' to the other, each add
// rounded to nearest even; then C += (even sum + odd sum). Denormal inputs read as zero, denormal
// results flush to zero, MXCSR is not read. A product of two bfloat16 is exact in float32, so the
// fused multiply-add is an add. This order differs from vdpbf16ps' (bf16.hpp): the AMX kernel's
// sums equal the emulation's to the float32 accumulation bound, not bit for bit.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/cpu/bf16.hpp"

namespace vitlens::detail {
namespace {

constexpr int kRows = 16;          // C's and A's tile rows
constexpr int kPairs = 16;         // pairs of k a step: A's tile is 16 x 64 bytes, B's 16 x 64 bytes
constexpr int kTileCols = 16;      // float32 columns of one C tile
constexpr int kCTiles = kBf16Nr / kTileCols;
static_assert(kCTiles == 3, "the tile below is written for NR = 48: C in tiles 0-2, A in 3, B in 4-6");
constexpr int kATile = 3, kBTile0 = 4;
constexpr int64_t kPanelRowBytes = kBf16Nr * 2 * sizeof(bf16_t);  // one pair of k across the panel: 192 bytes

// The 64-byte tile configuration (palette 1): each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles [0, tiles) of 16 rows x 64 bytes, the others unused (0 x 0).
TileConfig full_tiles(int tiles) {
  TileConfig config;
  for (int t = 0; t < tiles; ++t) config.colsb[t] = 64, config.rows[t] = kRows;
  return config;
}
constexpr int kKernelTiles = kBTile0 + kCTiles;  // C 0-2, A 3, B 4-6

// [SECTION] The instructions

struct HardwareTiles {
#if defined(__x86_64__)
  static void load_config(const TileConfig& config) { __asm__ volatile("ldtilecfg %0" ::"m"(config)); }
  static void configure() {
    static const TileConfig config = full_tiles(kKernelTiles);
    load_config(config);
  }
  static void release() { __asm__ volatile("tilerelease" ::); }
  template <int t>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(t));
  }
  template <int t>
  static void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(t) : "memory");
  }
  template <int t>
  static void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(t) : "memory");
  }
  template <int c, int a, int b>
  static void dot() {  // AT&T order: B, A, C
    __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(b), "i"(a), "i"(c));
  }
#endif
};

float flush(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }

struct SoftwareTiles {
  struct Tile {
    int rows = 0, colsb = 0;
    alignas(64) unsigned char bytes[kRows][64];
  };
  struct Registers {
    Tile tile[8];
  };
  static Registers& regs() {
    thread_local Registers r;  // tile state is each thread's, as in hardware
    return r;
  }
  static void configure() {
    const TileConfig config = full_tiles(kKernelTiles);
    for (int t = 0; t < 8; ++t) {
      Tile& tile = regs().tile[t];
      tile.rows = config.rows[t], tile.colsb = config.colsb[t];
      std::memset(tile.bytes, 0, sizeof tile.bytes);
    }
  }
  // After a release every tile is unconfigured, and using one is an error, as the instructions
  // fault then (#UD): a kernel that uses a tile outside thread_begin / thread_end fails its tests.
  static void release() {
    for (Tile& tile : regs().tile) tile.rows = tile.colsb = 0;
  }
  static Tile& configured(int t) {
    Tile& tile = regs().tile[t];
    if (tile.rows == 0) throw std::logic_error("AMX tile used without a tile configuration");
    return tile;
  }
  template <int t>
  static void zero() {
    std::memset(configured(t).bytes, 0, sizeof regs().tile[t].bytes);
  }
  template <int t>
  static void load(const void* base, int64_t stride) {
    Tile& tile = configured(t);
    for (int r = 0; r < tile.rows; ++r)
      std::memcpy(tile.bytes[r], static_cast<const unsigned char*>(base) + r * stride, static_cast<size_t>(tile.colsb));
  }
  template <int t>
  static void store(void* base, int64_t stride) {
    const Tile& tile = configured(t);
    for (int r = 0; r < tile.rows; ++r)
      std::memcpy(static_cast<unsigned char*>(base) + r * stride, tile.bytes[r], static_cast<size_t>(tile.colsb));
  }
  template <int c, int a, int b>
  static void dot() {
    Tile &dst = configured(c);
    const Tile &ta = configured(a), &tb = configured(b);
    const int n_cols = dst.colsb / 4, k_pairs = ta.colsb / 4;
    for (int m = 0; m < dst.rows; ++m) {
      float even[16] = {}, odd[16] = {};
      for (int k = 0; k < k_pairs; ++k) {
        bf16_t ap[2];
        std::memcpy(ap, ta.bytes[m] + 4 * k, sizeof ap);
        const float a_even = flush(bf16_to_float(ap[0])), a_odd = flush(bf16_to_float(ap[1]));
        for (int n = 0; n < n_cols; ++n) {
          bf16_t bp[2];
          std::memcpy(bp, tb.bytes[k] + 4 * n, sizeof bp);
          even[n] = flush(even[n] + a_even * flush(bf16_to_float(bp[0])));
          odd[n] = flush(odd[n] + a_odd * flush(bf16_to_float(bp[1])));
        }
      }
      for (int n = 0; n < n_cols; ++n) {
        float acc;
        std::memcpy(&acc, dst.bytes[m] + 4 * n, sizeof acc);
        acc = flush(flush(acc) + flush(even[n] + odd[n]));
        std::memcpy(dst.bytes[m] + 4 * n, &acc, sizeof acc);
      }
    }
  }
};

// [SECTION] The kernel

// One step: A's 16 rows x 16 pairs at a (row stride a_bytes), B's 16 pairs x 48 columns at b (row
// stride b_bytes), into C's three tiles.
template <class T>
inline void step(const bf16_t* a, int64_t a_bytes, const bf16_t* b, int64_t b_bytes) {
  T::template load<kATile>(a, a_bytes);
  T::template load<kBTile0>(b, b_bytes);
  T::template load<kBTile0 + 1>(b + 2 * kTileCols, b_bytes);
  T::template load<kBTile0 + 2>(b + 4 * kTileCols, b_bytes);
  T::template dot<0, kATile, kBTile0>();
  T::template dot<1, kATile, kBTile0 + 1>();
  T::template dot<2, kATile, kBTile0 + 2>();
}

// bf16.hpp's tile contract, for MR = 16: c (16, 48) = (load_c ? c : 0) + A B, then + bias.
template <class T>
void amx_tile(int k_pairs, const bf16_t* a, int64_t a_rs, const bf16_t* b_panel, float* c, int64_t ldc, bool load_c,
              const float* bias) {
  const int64_t c_bytes = ldc * static_cast<int64_t>(sizeof(float)), a_bytes = a_rs * static_cast<int64_t>(sizeof(bf16_t));
  // The last k_pairs % 16 pairs through zero-padded copies (a tile reads whole rows of 64 bytes,
  // past this block's pairs): the pads add products of zeros, +0 to each sum. Made before C is in
  // the tiles, which no call may hold across (the ABI does not preserve them). With K = 0 one step
  // of zeros still passes C through TDPBF16PS, which flushes a denormal C as the emulation does.
  const int whole = k_pairs / kPairs * kPairs, tail = k_pairs - whole;
  alignas(64) bf16_t a_pad[kRows][2 * kPairs];
  alignas(64) bf16_t b_pad[kPairs][2 * kBf16Nr];
  const bool padded_step = tail > 0 || k_pairs == 0;
  if (padded_step) {
    std::memset(a_pad, 0, sizeof a_pad);
    std::memset(b_pad, 0, sizeof b_pad);
    if (tail > 0) {  // (with K = 0, A and B may have no storage at all)
      for (int r = 0; r < kRows; ++r)
        std::memcpy(a_pad[r], a + r * a_rs + 2 * whole, sizeof(bf16_t) * 2 * static_cast<size_t>(tail));
      std::memcpy(b_pad, b_panel + 2 * kBf16Nr * whole, sizeof(bf16_t) * 2 * kBf16Nr * static_cast<size_t>(tail));
    }
  }
  if (load_c) {
    T::template load<0>(c, c_bytes);
    T::template load<1>(c + kTileCols, c_bytes);
    T::template load<2>(c + 2 * kTileCols, c_bytes);
  } else {
    T::template zero<0>();
    T::template zero<1>();
    T::template zero<2>();
  }
  for (int p = 0; p < whole; p += kPairs) step<T>(a + 2 * p, a_bytes, b_panel + 2 * kBf16Nr * p, kPanelRowBytes);
  if (padded_step) step<T>(&a_pad[0][0], sizeof a_pad[0], &b_pad[0][0], sizeof b_pad[0]);
  T::template store<0>(c, c_bytes);
  T::template store<1>(c + kTileCols, c_bytes);
  T::template store<2>(c + 2 * kTileCols, c_bytes);
  if (bias)
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kBf16Nr; ++j) c[r * ldc + j] += bias[j];
}

}  // namespace

#if defined(__x86_64__)
void amx_dot_loop(int64_t iterations) {
  using T = HardwareTiles;
  const TileConfig config = full_tiles(8);
  T::load_config(config);
  T::zero<4>(), T::zero<5>(), T::zero<6>(), T::zero<7>();
  T::zero<0>(), T::zero<1>(), T::zero<2>(), T::zero<3>();
  for (int64_t i = 0; i < iterations; ++i) {  // four accumulators: tiles 0-3 += (4 or 5) x (6 or 7)
    T::dot<0, 4, 6>();
    T::dot<1, 4, 7>();
    T::dot<2, 5, 6>();
    T::dot<3, 5, 7>();
  }
  T::release();
}

const Bf16GemmKernels kAmxBf16Gemm{kAmxMr, amx_tile<HardwareTiles>, convert_row_avx512bf16, HardwareTiles::configure,
                                   HardwareTiles::release};
#endif
const Bf16GemmKernels kAmxSoftwareTilesGemm{kAmxMr, amx_tile<SoftwareTiles>, convert_row_emulated,
                                            SoftwareTiles::configure, SoftwareTiles::release};

}  // namespace vitlens::detail
