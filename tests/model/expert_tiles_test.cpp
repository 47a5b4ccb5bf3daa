// The tile-major expert layout (src/backend/cuda/expert_tiles.h) on the CPU: the piece map the device repack kernel
// uses (tile_piece_src) must put every row byte where the decode MMA walk reads it (tile_piece for weights, 1024 + 4 r
// for scales), and cover each block byte exactly once. The GPU op test (CudaOps.Mxfp4DecodeExpertsMma) then checks
// the walk on the tiles against the row-major walk bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/expert_tiles.h"

namespace {

using dsv4::cuda::kTileStepBytes;
using dsv4::cuda::kTileStepPieces;

// Builds block (t, k) of a 16-row tile from row-major weights [rows, K/2] and scales [rows, K/32] with the piece map.
std::vector<uint8_t> build_block(const std::vector<uint8_t>& w, const std::vector<uint8_t>& sc, int64_t K, int64_t t,
                                 int64_t k) {
  std::vector<uint8_t> out(kTileStepBytes, 0);
  for (int p = 0; p < kTileStepPieces; ++p) {
    const dsv4::cuda::TilePieceSrc src = dsv4::cuda::tile_piece_src(p, k);
    for (int b = 0; b < 16; ++b) {
      const int r = src.scales ? src.row + b / 4 : src.row;
      const int64_t row = dsv4::cuda::tile_row(false, t, r);
      out[16 * p + b] = src.scales ? sc[row * (K / 32) + src.byte + b % 4] : w[row * (K / 2) + src.byte + b];
    }
  }
  return out;
}

TEST(ExpertTiles, PieceMapPutsEveryRowByteWhereTheWalkReadsIt) {
  const int64_t K = 512, rows = 48;  // 3 down tiles of 4 steps
  std::mt19937 g(7);
  std::vector<uint8_t> w(static_cast<size_t>(rows * K / 2)), sc(static_cast<size_t>(rows * K / 32));
  for (auto& v : w) v = static_cast<uint8_t>(g());
  for (auto& v : sc) v = static_cast<uint8_t>(g());
  for (int64_t t = 0; t < rows / 16; ++t) {
    for (int64_t k = 0; k < K / 128; ++k) {
      const std::vector<uint8_t> blk = build_block(w, sc, K, t, k);
      for (int r = 0; r < 16; ++r) {
        const int64_t row = 16 * t + r;
        for (int c = 0; c < 4; ++c)  // logical chunk c = columns 128 k + 32 c .. + 31 = row bytes 64 k + 16 c ..
          for (int b = 0; b < 16; ++b)
            ASSERT_EQ(blk[dsv4::cuda::tile_piece(r, c) + b], w[row * (K / 2) + 64 * k + 16 * c + b])
                << "tile " << t << " step " << k << " row " << r << " chunk " << c;
        for (int b = 0; b < 4; ++b) ASSERT_EQ(blk[1024 + 4 * r + b], sc[row * (K / 32) + 4 * k + b]);
      }
    }
  }
}

TEST(ExpertTiles, PiecesCoverTheBlockOnce) {
  // tile_piece over (r, c) is a permutation of the 64 weight pieces; the scale pieces are the last 4.
  std::vector<int> hits(kTileStepPieces, 0);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 4; ++c) ++hits[dsv4::cuda::tile_piece(r, c) / 16];
  for (int p = 64; p < kTileStepPieces; ++p) ++hits[p];
  for (int p = 0; p < kTileStepPieces; ++p) EXPECT_EQ(hits[p], 1) << "piece " << p;
  EXPECT_EQ(kTileStepBytes, 16 * 64 + 16 * 4);
}

TEST(ExpertTiles, GateUpRowsInterleaveW1AndW3) {
  // Gate/up tile t: slot rows 0-7 are w1 rows 8t..8t+7, slot rows 8-15 the same rows of w3 (the walk's flush pairs
  // slot rows g and g + 8 as gate and up of intermediate row 8t + g).
  for (int r = 0; r < 16; ++r) EXPECT_EQ(dsv4::cuda::tile_row(true, 5, r), 40 + (r & 7));
  EXPECT_EQ(dsv4::cuda::tile_bytes(true, 4096, 2048), 256 * 32 * kTileStepBytes);  // Flash gate/up: I/8 tiles x d/128
  EXPECT_EQ(dsv4::cuda::tile_bytes(false, 4096, 2048), 256 * 16 * kTileStepBytes);  // down: d/16 tiles x I/128
  EXPECT_TRUE(dsv4::cuda::tiles_shape_ok(4096, 1024));
  EXPECT_FALSE(dsv4::cuda::tiles_shape_ok(4160, 2048));
}

}  // namespace
