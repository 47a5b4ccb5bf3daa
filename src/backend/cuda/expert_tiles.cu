// Builds the tile-major copies of MXFP4 routed experts (expert_tiles.h) on the device from their row-major weights.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/expert_tiles.h"
#include "backend/cuda/ops.h"
#include "core/error.h"

namespace dsv4::cuda {
namespace {

// One thread per 16-byte piece of the output. Rows: gate/up slot rows 0-7 from (wa, sa), 8-15 from (wb, sb_);
// down: all 16 from (wa, sa). K columns per row (K / 2 weight bytes, K / 32 scale bytes).
__global__ void repack_tiles_kernel(const uint8_t* wa, const uint8_t* sa, const uint8_t* wb, const uint8_t* sbp,
                                    bool gate_up, int64_t K, int64_t tiles, uint8_t* out) {
  const int64_t steps = K / 128, total = tiles * steps * kTileStepPieces;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int p = static_cast<int>(i % kTileStepPieces);
    const int64_t blk = i / kTileStepPieces, t = blk / steps, k = blk % steps;
    const TilePieceSrc src = tile_piece_src(p, k);
    uint32_t v[4];
    if (!src.scales) {
      const int64_t row = tile_row(gate_up, t, src.row);
      const uint8_t* w = (gate_up && src.row >= 8 ? wb : wa) + row * (K / 2) + src.byte;
      const uint4 q = *reinterpret_cast<const uint4*>(w);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      for (int j = 0; j < 4; ++j) {  // 4 rows' 4 scale bytes (K / 32 per row: 4-byte aligned since K % 128 == 0)
        const int r = src.row + j;
        const int64_t row = tile_row(gate_up, t, r);
        v[j] = *reinterpret_cast<const uint32_t*>((gate_up && r >= 8 ? sbp : sa) + row * (K / 32) + src.byte);
      }
    }
    *reinterpret_cast<uint4*>(out + i * 16) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

void repack(const void* wa, const void* sa, const void* wb, const void* sb, bool gate_up, int64_t K, int64_t tiles,
            void* out, cudaStream_t s) {
  const int64_t total = tiles * (K / 128) * kTileStepPieces;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
  repack_tiles_kernel<<<blocks, 256, 0, s>>>(static_cast<const uint8_t*>(wa), static_cast<const uint8_t*>(sa),
                                             static_cast<const uint8_t*>(wb), static_cast<const uint8_t*>(sb), gate_up,
                                             K, tiles, static_cast<uint8_t*>(out));
  DSV4_CU(cudaGetLastError());
}

}  // namespace

void build_expert_tiles(const DevExpert& e, WeightFormat fmt, int64_t d, int64_t I, int64_t sb1, int64_t sb2,
                        void* t13, void* t2, cudaStream_t s) {
  if (fmt != WeightFormat::MXFP4 || !tiles_shape_ok(d, I) || sb1 != d / 32 || sb2 != I / 32)
    throw Error("build_expert_tiles: tile-major copies need MXFP4 experts with whole 128-column steps (d=" +
                std::to_string(d) + ", I=" + std::to_string(I) + ")");
  repack(e.w1, e.s1, e.w3, e.s3, true, d, I / 8, t13, s);
  repack(e.w2, e.s2, nullptr, nullptr, false, I, d / 16, t2, s);
}

}  // namespace dsv4::cuda
