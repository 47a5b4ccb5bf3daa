// The computed tensor inventory vs the real V4-Flash checkpoint listing (MODEL.md §2: 46 shards, 69,187 tensors,
// 158,069,433,298 stored elements, 148.65 GiB) and the derived Pro numbers.
#include <gtest/gtest.h>

#include <cstdio>

#include "model/inventory.h"

namespace dsv4 {
namespace {

TEST(Inventory, FlashMatchesTheRealCheckpointListing) {
  auto inv = official_inventory(flash_config());
  int64_t elements = 0;
  uint64_t bytes = 0;
  for (const auto& t : inv) elements += t.numel(), bytes += t.bytes();
  std::printf("[inventory] flash: %zu tensors, %lld elements, %.2f GiB\n", inv.size(), (long long)elements,
              static_cast<double>(bytes) / (1ull << 30));
  EXPECT_EQ(inv.size(), 69187u);
  EXPECT_EQ(elements, 158069433298LL);
  EXPECT_NEAR(static_cast<double>(bytes) / (1ull << 30), 148.65, 0.01);
}

TEST(Inventory, ProMatchesTheDerivedNumbers) {
  auto inv = official_inventory(pro_config());
  uint64_t bytes = 0;
  for (const auto& t : inv) bytes += t.bytes();
  std::printf("[inventory] pro: %zu tensors, %.2f GiB\n", inv.size(), static_cast<double>(bytes) / (1ull << 30));
  EXPECT_EQ(inv.size(), 145116u);                                          // MODEL.md §2 (derived)
  EXPECT_NEAR(static_cast<double>(bytes) / 1e9, 864.7, 0.5);              // ≈ 864.7 GB (derived)
}

TEST(Inventory, Nvfp4AddsScalesOnlyToMainLayerExperts) {
  auto a = official_inventory(flash_config());
  auto b = official_inventory(flash_config(), ReleaseFormat::nvfp4());
  uint64_t ba = 0, bb = 0;
  size_t nvfp4_mtp = 0;
  for (const auto& t : a) ba += t.bytes();
  for (const auto& t : b) {
    bb += t.bytes();
    if (t.name.rfind("mtp.", 0) == 0 && t.name.find("weight_scale_2") != std::string::npos) ++nvfp4_mtp;
  }
  EXPECT_EQ(nvfp4_mtp, 0u);
  // Experts go from 1/32 to 1/16 byte of scale per element (+ two scalars per projection): ≈ +8.7 GB (MODEL.md §3.6).
  EXPECT_NEAR(static_cast<double>(bb - ba) / 1e9, 8.7, 0.2);
}

}  // namespace
}  // namespace dsv4
