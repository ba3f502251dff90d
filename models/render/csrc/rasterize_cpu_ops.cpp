// torch binding of the CPU rasteriser: torch.ops.splatzoo_cpu.{forward,backward}.
//
// Only light ATen headers (no torch/extension.h, no pybind11): this file is loaded with
// torch.ops.load_library, which keeps the first build short.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "rasterize_cpu.h"

namespace {

void check_input(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t images,
                 int64_t num, int64_t last_dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  const bool matrix = last_dim > 0;
  TORCH_CHECK(t.dim() == (matrix ? 3 : 2) && t.size(0) == images && t.size(1) == num &&
                  (!matrix || t.size(2) == last_dim),
              name, " has shape ", t.sizes(), ", expected [", images, ", ", num,
              matrix ? ", " + std::to_string(last_dim) : std::string(), "]");
}

template <typename T>
splatzoo::Splats<T> splats(const at::Tensor& means2d, const at::Tensor& conics,
                           const at::Tensor& colors, const at::Tensor& opacities,
                           const at::Tensor& depths, const at::Tensor& radii, int64_t height,
                           int64_t width, int64_t tile) {
  return {means2d.data_ptr<T>(),   conics.data_ptr<T>(), colors.data_ptr<T>(),
          opacities.data_ptr<T>(), depths.data_ptr<T>(), radii.data_ptr<int32_t>(),
          means2d.size(0),         means2d.size(1),      height,
          width,                   tile};
}

void check_all(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
               const at::Tensor& opacities, const at::Tensor& depths, const at::Tensor& radii,
               int64_t height, int64_t width, int64_t tile) {
  TORCH_CHECK(means2d.dim() == 3, "means2d must be [I, N, 2], got ", means2d.sizes());
  const int64_t images = means2d.size(0), num = means2d.size(1);
  const auto dtype = means2d.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "the CPU rasteriser supports float32 and float64, got ", dtype);
  check_input(means2d, "means2d", dtype, images, num, 2);
  check_input(conics, "conics", dtype, images, num, 3);
  check_input(colors, "colors", dtype, images, num, 3);
  check_input(opacities, "opacities", dtype, images, num, 0);
  check_input(depths, "depths", dtype, images, num, 0);
  check_input(radii, "radii", at::kInt, images, num, 2);
  TORCH_CHECK(height > 0 && width > 0 && tile > 0, "height, width and tile must be positive");
  TORCH_CHECK(num < (int64_t(1) << 31), "too many Gaussians per image");
}

// Returns out [I, 5, H, W] (r, g, b, depth, alpha), t_final [I, H, W], last [I, H, W] int32,
// offsets [I * tiles + 1] int64, ids [M] int32.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
    const at::Tensor& opacities, const at::Tensor& depths, const at::Tensor& radii, int64_t height,
    int64_t width, int64_t tile) {
  check_all(means2d, conics, colors, opacities, depths, radii, height, width, tile);
  const int64_t images = means2d.size(0);
  const auto options = means2d.options();
  at::Tensor out = at::empty({images, 5, height, width}, options);
  at::Tensor t_final = at::empty({images, height, width}, options);
  at::Tensor last = at::empty({images, height, width}, options.dtype(at::kInt));
  at::Tensor offsets, ids;
  const int threads = at::get_num_threads();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const auto s = splats<T>(means2d, conics, colors, opacities, depths, radii, height, width, tile);
    splatzoo::Bins bins = splatzoo::bin_tiles<T>(s, threads);
    offsets = at::empty({static_cast<int64_t>(bins.offsets.size())}, options.dtype(at::kLong));
    ids = at::empty({static_cast<int64_t>(bins.ids.size())}, options.dtype(at::kInt));
    std::memcpy(offsets.data_ptr<int64_t>(), bins.offsets.data(),
                bins.offsets.size() * sizeof(int64_t));
    if (!bins.ids.empty()) {
      std::memcpy(ids.data_ptr<int32_t>(), bins.ids.data(), bins.ids.size() * sizeof(int32_t));
    }
    const splatzoo::BinsView view{bins.offsets.data(), bins.ids.data(),
                                  static_cast<int64_t>(bins.ids.size())};
    splatzoo::rasterize_forward<T>(s, view, out.data_ptr<T>(), t_final.data_ptr<T>(),
                                   last.data_ptr<int32_t>(), threads);
  };
  if (means2d.scalar_type() == at::kFloat) {
    run(float(0));
  } else {
    run(double(0));
  }
  return {out, t_final, last, offsets, ids};
}

// Returns grads [I, N, 10] in the input dtype: d means2d (2), d conics (3), d colors (3),
// d opacities, d depths.
at::Tensor backward(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                    const at::Tensor& opacities, const at::Tensor& depths, const at::Tensor& radii,
                    int64_t height, int64_t width, int64_t tile, const at::Tensor& offsets,
                    const at::Tensor& ids, const at::Tensor& t_final, const at::Tensor& last,
                    const at::Tensor& grad_out) {
  check_all(means2d, conics, colors, opacities, depths, radii, height, width, tile);
  const int64_t images = means2d.size(0), num = means2d.size(1);
  const auto dtype = means2d.scalar_type();
  const int64_t tiles = ((width + tile - 1) / tile) * ((height + tile - 1) / tile);
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.is_contiguous() &&
                  offsets.numel() == images * tiles + 1,
              "offsets do not match the inputs");
  TORCH_CHECK(ids.scalar_type() == at::kInt && ids.is_contiguous(), "ids must be int32");
  TORCH_CHECK(t_final.scalar_type() == dtype && t_final.is_contiguous() &&
                  t_final.numel() == images * height * width,
              "t_final does not match the inputs");
  TORCH_CHECK(last.scalar_type() == at::kInt && last.is_contiguous() &&
                  last.numel() == images * height * width,
              "last does not match the inputs");
  TORCH_CHECK(grad_out.scalar_type() == dtype && grad_out.is_contiguous() &&
                  grad_out.numel() == images * 5 * height * width,
              "grad_out must be a contiguous [I, 5, H, W] tensor of the inputs' dtype");
  at::Tensor grads = at::zeros({images, num, 10}, means2d.options().dtype(at::kDouble));
  const int threads = at::get_num_threads();
  const splatzoo::BinsView view{offsets.data_ptr<int64_t>(), ids.data_ptr<int32_t>(),
                                ids.numel()};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const auto s = splats<T>(means2d, conics, colors, opacities, depths, radii, height, width, tile);
    splatzoo::rasterize_backward<T>(s, view, t_final.data_ptr<T>(), last.data_ptr<int32_t>(),
                                    grad_out.data_ptr<T>(), grads.data_ptr<double>(), threads);
  };
  if (dtype == at::kFloat) {
    run(float(0));
  } else {
    run(double(0));
  }
  return grads.to(dtype);
}

}  // namespace

TORCH_LIBRARY(splatzoo_cpu, m) {
  m.def("forward", &forward);
  m.def("backward", &backward);
}
