#include "runtime/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#if defined(DSV4_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace dsv4 {
std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") {
#if defined(DSV4_HAVE_CUDA)
    return make_cuda_backend();
#else
    fail("the CUDA backend was not compiled into this build (dsv4 --version)");
#endif
  }
  fail("unknown backend '", name, "' (expected cpu or cuda)");
}
}  // namespace dsv4
