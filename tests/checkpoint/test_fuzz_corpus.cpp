// The committed fuzz seeds are also regression inputs: valid_* must parse, bad_* must be refused with a dsv4::Error
// naming the file. Keeps the seeds honest if the generator or the parser changes.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/safetensors.h"
#include "helpers.h"

namespace dsv4::ckpt {
namespace {

TEST(FuzzCorpus, SeedsBehaveAsNamed) {
  const auto dir = std::filesystem::path(DSV4_SOURCE_DIR) / "fuzz" / "corpus" / "safetensors_header";
  int valid = 0, bad = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string path = e.path().string();
    if (name.rfind("valid_", 0) == 0) {
      EXPECT_NO_THROW(SafetensorsFile f(path)) << path;
      ++valid;
    } else if (name.rfind("bad_", 0) == 0) {
      EXPECT_TRUE(testing::ThrowsErrorWith([&] { SafetensorsFile f(path); }, {path})) << path;
      ++bad;
    }
  }
  EXPECT_GE(valid, 5);
  EXPECT_GE(bad, 10);
}

}  // namespace
}  // namespace dsv4::ckpt
