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

// Batched decode across sequences allocates nothing per step either (row pointers and positions are the caller's).
TEST(DecodeLoop, NoHeapAllocationPerBatchedStep) {
  for (const std::string name : {"flash_fp8", "pro_fp8"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    auto ids = read_bin<int32_t>(dir + "/ids.bin");
    Model m(dir, make_cpu_backend(), Numerics::Official);
    const int S = 3;
    Forward fwd(m, S);
    std::vector<std::unique_ptr<SequenceState>> sts;
    std::vector<SequenceState*> rows;
    for (int s = 0; s < S; ++s) {
      sts.push_back(m.backend().new_sequence(static_cast<int64_t>(ids.size())));
      rows.push_back(sts.back().get());
    }
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size) * S);
    std::vector<int32_t> tok(S);
    std::vector<int64_t> pos(S);
    // Sequence s starts s tokens ahead (its first tokens as a chunk), so the rows sit at different positions.
    for (int s = 1; s < S; ++s) fwd.forward(*rows[static_cast<size_t>(s)], ids.data(), s, 0, logits.data(), true);
    auto step = [&](size_t k) {
      for (int s = 0; s < S; ++s) {
        pos[static_cast<size_t>(s)] = static_cast<int64_t>(k) + s;
        tok[static_cast<size_t>(s)] = ids[k + static_cast<size_t>(s)];
      }
      fwd.forward_batch(rows.data(), tok.data(), pos.data(), S, logits.data());
    };
    step(0);  // first step may size lazily-grown buffers
    g_allocs = 0;
    g_counting = true;
    for (size_t k = 1; k + S < ids.size(); ++k) step(k);
    g_counting = false;
    EXPECT_EQ(g_allocs.load(), 0) << name << ": heap allocations during batched decode steps";
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
