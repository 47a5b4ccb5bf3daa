#include "dsv4/version.h"

#include "build_info.h"

namespace dsv4 {
bool cuda_backend_compiled() { return DSV4_HAVE_CUDA_BUILD != 0; }
std::string version_string() {
  std::string s = std::string("dsv4 ") + DSV4_VERSION_STRING + " (CUDA backend: ";
  s += cuda_backend_compiled() ? std::string("compiled for ") + DSV4_CUDA_ARCH_STRING : std::string("not compiled");
  return s + ")";
}
}  // namespace dsv4
