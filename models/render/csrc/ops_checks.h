// Argument checks shared by the torch bindings of the CPU library (light ATen headers only).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace splatzoo {

// A CPU tensor of `dtype`, contiguous, of exactly `shape`; else a TORCH_CHECK error naming it.
inline void check_shape(const at::Tensor& t, const char* name, at::ScalarType dtype,
                        std::vector<int64_t> shape) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

}  // namespace splatzoo
