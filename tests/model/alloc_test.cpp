// Once a session is set up, the decode loop performs no heap allocation (counted by replacing operator new).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "backend/cpu/cpu_backend.h"
#include "fixture_util.h"

static std::atomic<long> g_allocs{0};
static std::atomic<bool> g_counting{false};

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace dsv4::test {
namespace {

TEST(DecodeLoop, NoHeapAllocationPerToken) {
  auto cases = fixture_cases();
  ASSERT_FALSE(cases.empty());
  for (const std::string name : {"flash_fp8", "pro_fp8"}) {  // every layer kind, FP8 + FP4 paths
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    Model m(dir, make_cpu_backend(), Numerics::Official);  // official touches the most scratch paths
    Forward fwd(m, 1);
    auto st = m.backend().new_sequence(static_cast<int64_t>(ids.size()));
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
    fwd.forward(*st, ids.data(), 1, 0, logits.data());  // first step may size lazily-grown buffers
    g_allocs = 0;
    g_counting = true;
    for (size_t p = 1; p < ids.size(); ++p) fwd.forward(*st, ids.data() + p, 1, static_cast<int64_t>(p), logits.data());
    g_counting = false;
    EXPECT_EQ(g_allocs.load(), 0) << name << ": heap allocations during " << ids.size() - 1 << " decode steps";
  }
}

// The counter itself works (so the test above can fail).
TEST(DecodeLoop, CounterSeesAllocations) {
  g_allocs = 0;
  g_counting = true;
  auto* v = new std::vector<int>(100);
  g_counting = false;
  delete v;
  EXPECT_GE(g_allocs.load(), 1);
}

}  // namespace
}  // namespace dsv4::test
