#include "runtime/backend_factory.h"

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#if defined(DSV4_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsv4 {
std::unique_ptr<Backend> make_backend(const std::string& name, int tp) {
  if (tp != 1 && tp != 2 && tp != 4 && tp != 8) fail("--tp must be 1, 2, 4 or 8 (got ", tp, ")");
  if (name == "cpu") {
    if (tp != 1) fail("tensor parallelism (--tp ", tp, ") needs --backend cuda");
    return make_cpu_backend();
  }
  if (name == "cuda") {
#if defined(DSV4_HAVE_CUDA)
    if (tp == 1) return make_cuda_backend();
    std::vector<int> devices;
    for (int i = 0; i < tp; ++i) devices.push_back(i);
    return make_tp_backend(devices);
#else
    fail("the CUDA backend was not compiled into this build (dsv4 --version)");
#endif
  }
  fail("unknown backend '", name, "' (expected cpu or cuda)");
}
}  // namespace dsv4
