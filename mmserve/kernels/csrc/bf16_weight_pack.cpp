// Packing a weight into the tiles of bf16_weight_tiles.h, and widening them back (the path
// that hands many rows to oneDNN, layers/bf16_weights.py).
#pragma GCC optimize("O3")

#include "bf16_weight_tiles.h"
#include "ops.h"

#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <cstring>
#include <vector>

using bf16_tiles::TILE;
using bf16_tiles::vf;
using bf16_tiles::W;
using bf16_tiles::widen;

int64_t bf16_weight_pack(const Tensor& weight, const Tensor& out) {
  using torch::headeronly::ScalarType;
  MMSERVE_CHECK(weight.is_cpu() && weight.dim() == 2 && weight.is_contiguous() &&
                    weight.scalar_type() == ScalarType::Float,
                "weight must be a contiguous float32 CPU tensor [n, in]");
  const int64_t n_dim = weight.size(0), k_dim = weight.size(1);
  const int64_t tiles = (n_dim + TILE - 1) / TILE;
  MMSERVE_CHECK(out.is_cpu() && out.dim() == 3 && out.is_contiguous() &&
                    out.scalar_type() == ScalarType::BFloat16 && out.size(0) == tiles &&
                    out.size(1) == k_dim && out.size(2) == TILE,
                "out must be a contiguous bfloat16 CPU tensor [", tiles, ", ", k_dim, ", ", TILE,
                "]");
  const auto* pw = reinterpret_cast<const uint32_t*>(weight.const_data_ptr());
  auto* po = reinterpret_cast<uint16_t*>(out.mutable_data_ptr());
  std::vector<int64_t> inexact(tiles, 0);
  torch::stable::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t bad = 0;
      for (int i = 0; i < TILE; ++i) {  // row t * TILE + i goes to lane i % W, half i / W
        const int64_t n = t * TILE + i;
        uint16_t* dest = po + t * k_dim * TILE + 2 * (i % W) + i / W;
        if (n >= n_dim) {
          for (int64_t k = 0; k < k_dim; ++k) dest[k * TILE] = 0;
          continue;
        }
        const uint32_t* row = pw + n * k_dim;
        for (int64_t k = 0; k < k_dim; ++k) {
          bad += (row[k] & 0xFFFFu) != 0;
          dest[k * TILE] = static_cast<uint16_t>(row[k] >> 16);
        }
      }
      inexact[t] = bad;
    }
  });
  int64_t total = 0;
  for (const int64_t bad : inexact) total += bad;
  return total;
}

// out [in, tiles x TILE] = the packed weight widened and transposed (padding rows as zero
// columns): each tile's column k is one load, two widened vectors, stored side by side.
void bf16_weight_unpack(const Tensor& packed, const Tensor& out) {
  using torch::headeronly::ScalarType;
  MMSERVE_CHECK(packed.is_cpu() && packed.dim() == 3 && packed.is_contiguous() &&
                    packed.scalar_type() == ScalarType::BFloat16 && packed.size(2) == TILE,
                "packed must be a contiguous bfloat16 CPU tensor [tiles, in, ", TILE, "]");
  const int64_t tiles = packed.size(0), k_dim = packed.size(1), width = tiles * TILE;
  MMSERVE_CHECK(out.is_cpu() && out.dim() == 2 && out.is_contiguous() &&
                    out.scalar_type() == ScalarType::Float && out.size(0) == k_dim &&
                    out.size(1) == width,
                "out must be a contiguous float32 CPU tensor [", k_dim, ", ", width, "]");
  const auto* pw = reinterpret_cast<const uint16_t*>(packed.const_data_ptr());
  float* po = out.mutable_data_ptr<float>();
  torch::stable::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* tile = pw + t * k_dim * TILE;
      for (int64_t k = 0; k < k_dim; ++k) {
        vf halves[2];
        widen(tile + k * TILE, halves[0], halves[1]);
        std::memcpy(po + k * width + t * TILE, halves, sizeof(halves));
      }
    }
  });
}

int64_t bf16_weight_tile_rows() { return TILE; }
