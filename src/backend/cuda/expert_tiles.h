#pragma once
// Tile-major copies of MXFP4 routed experts for the decode MMA walk (expert_mma.cuh), host and device.
//
// Why: the walk reads, per warp and 128-column step, 16 rows x 64 bytes (rows 0.5-2 KB apart) plus 16 separate
// 4-byte scale words: 64 16-byte and 16 4-byte copies per warp step over 32 different lines, which a probe
// (tools/gpu/probes/expert_layout_probe.cu) measured at 78-89 % of a plain stream of the same bytes. In a tile-major
// copy, step k of tile t is ONE contiguous block of 1,088 bytes laid out exactly as the walk's ring slot wants it
// (the 16 rows' 64-byte pieces already at their swizzled slot positions, then the 16 rows' 4 scale bytes), so a warp
// fetches a step with 2-3 coalesced 16-byte copies per lane from two or three 512-byte stretches (the probe: 100 %).
// In the engine that was worth only ~1-2 us per layer (docs/BENCHMARKS.md, session 12): the launches are latency-bound
// elsewhere.
//
// Layout of one matrix kind of one expert: block (t, k) at byte ((t * steps + k) * kTileStepBytes), t < tiles,
// k < steps = K / 128. Inside a block, slot row r (0..15) and logical 16-byte chunk c (0..3, columns
// 128 k + 32 c .. + 31) sit at tile_piece(r, c) = MmaCfg<4>::piece(r, c); row r's 4 E8M0 scales of the step at
// 1024 + 4 r. Slot rows: gate/up tile t = rows 8t..8t+7 of w1 (slot rows 0-7) and the same rows of w3 (8-15),
// I / 8 tiles of d / 128 steps; down tile t = rows 16t..16t+15 of w2, d / 16 tiles of I / 128 steps.
//
// Measurement mode (DSV4_EXPERT_TILES=1 at load): the tiles are an extra copy beside the row-major weights, which
// the other expert kernels (prefill, the FMA walks) still read -- the routed experts' memory doubles.
#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_TILES_HD __host__ __device__
#else
#define DSV4_TILES_HD
#endif

namespace dsv4::cuda {

constexpr int kTileStepBytes = 1088;  // 16 rows x 64 weight bytes + 16 rows x 4 scale bytes
constexpr int kTileStepPieces = kTileStepBytes / 16;

// Byte offset of slot row r's logical chunk c inside a block (expert_mma.cuh's MmaCfg<4>::piece: the 8 rows one
// ldmatrix reads fall in 8 different 16-byte bank groups).
DSV4_TILES_HD inline int tile_piece(int r, int c) { return 64 * r + 16 * (c ^ ((r >> 1) & 3)); }

// Where the 16-byte piece p (0..67) of a block comes from, for the block's step k: weights (p < 64) are row r's
// bytes [64 k + 16 c, + 16) (16 bytes of one row); scales (p >= 64) are 4 bytes [4 k, + 4) of each of rows
// 4 (p - 64) .. + 3, in that order.
struct TilePieceSrc {
  int row;  // slot row (weights) or the first of 4 slot rows (scales)
  int64_t byte;  // offset in the row's weight bytes, or in each row's scale bytes
  bool scales;
};
DSV4_TILES_HD inline TilePieceSrc tile_piece_src(int p, int64_t k) {
  if (p >= 64) return TilePieceSrc{4 * (p - 64), 4 * k, true};
  const int r = p >> 2, pos = p & 3, c = pos ^ ((r >> 1) & 3);  // tile_piece is an involution on the position
  return TilePieceSrc{r, 64 * k + 16 * c, false};
}

// Slot row r of tile t -> the matrix row (and for gate/up which of w1 / w3: r >= 8 is w3).
DSV4_TILES_HD inline int64_t tile_row(bool gate_up, int64_t t, int r) { return gate_up ? 8 * t + (r & 7) : 16 * t + r; }

inline int64_t tile_bytes(bool gate_up, int64_t d, int64_t I) {
  const int64_t tiles = gate_up ? I / 8 : d / 16, steps = (gate_up ? d : I) / 128;
  return tiles * steps * kTileStepBytes;
}
// The shapes the tile-major copies cover: whole 128-column steps and whole tiles.
inline bool tiles_shape_ok(int64_t d, int64_t I) { return d % 128 == 0 && I % 128 == 0; }

}  // namespace dsv4::cuda
