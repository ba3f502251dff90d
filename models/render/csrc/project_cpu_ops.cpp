// torch binding of the CPU projection: torch.ops.splatzoo_cpu.{project_forward,project_backward}.
//
// Light ATen headers only, as rasterize_cpu_ops.cpp (which defines the library; this file adds
// to it).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "ops_checks.h"
#include "project_cpu.h"

namespace {

using splatzoo::check_shape;

struct Inputs {
  const at::Tensor &means, &scales, &rotations, &opacities, &harmonics, &valid, &view, &centres,
      &intrinsics, &near, &far;
  int64_t height, width;
  double eps2d;
  bool antialiased;

  int64_t batch() const { return means.size(0); }
  int64_t num() const { return means.size(1); }
  int64_t views() const { return view.size(1); }
  int64_t bases() const { return harmonics.size(3); }

  void check() const {
    TORCH_CHECK(means.dim() == 3 && view.dim() == 4 && harmonics.dim() == 4,
                "means must be [B, N, 3], view [B, V, 4, 4], harmonics [B, N, 3, K]");
    const auto dtype = means.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
                "the CPU projection supports float32 and float64, got ", dtype);
    const int64_t b = batch(), n = num(), v = views(), k = bases();
    TORCH_CHECK(k >= 1 && k <= 25 && int64_t(std::lround(std::sqrt(double(k)))) *
                                          int64_t(std::lround(std::sqrt(double(k)))) == k,
                "harmonics must have (d + 1)^2 <= 25 coefficients, got ", k);
    check_shape(means, "means", dtype, {b, n, 3});
    check_shape(scales, "scales", dtype, {b, n, 3});
    check_shape(rotations, "rotations", dtype, {b, n, 4});
    check_shape(opacities, "opacities", dtype, {b, n});
    check_shape(harmonics, "harmonics", dtype, {b, n, 3, k});
    check_shape(valid, "valid", at::kBool, {b, n});
    check_shape(view, "view", dtype, {b, v, 4, 4});
    check_shape(centres, "centres", dtype, {b, v, 3});
    check_shape(intrinsics, "intrinsics", dtype, {b, v, 3, 3});
    check_shape(near, "near", dtype, {b, v});
    check_shape(far, "far", dtype, {b, v});
    TORCH_CHECK(height > 0 && width > 0, "height and width must be positive");
  }

  template <typename T>
  splatzoo::Scene<T> scene() const {
    return {means.data_ptr<T>(),     scales.data_ptr<T>(),  rotations.data_ptr<T>(),
            opacities.data_ptr<T>(), harmonics.data_ptr<T>(), valid.data_ptr<bool>(),
            view.data_ptr<T>(),      centres.data_ptr<T>(), intrinsics.data_ptr<T>(),
            near.data_ptr<T>(),      far.data_ptr<T>(),     batch(),
            views(),                 num(),                 bases(),
            height,                  width,                 static_cast<T>(eps2d),
            antialiased};
  }
};

template <typename F>
void dispatch(at::ScalarType dtype, F&& run) {
  if (dtype == at::kFloat) {
    run(float(0));
  } else {
    run(double(0));
  }
}

// Returns means2d [I, N, 2], conics [I, N, 3], colors [I, N, 3], opacities [I, N], depths
// [I, N] and radii [I, N, 2] int32 for the I = B * V images.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
project_forward(const at::Tensor& means, const at::Tensor& scales, const at::Tensor& rotations,
                const at::Tensor& opacities, const at::Tensor& harmonics, const at::Tensor& valid,
                const at::Tensor& view, const at::Tensor& centres, const at::Tensor& intrinsics,
                const at::Tensor& near, const at::Tensor& far, int64_t height, int64_t width,
                double eps2d, bool antialiased) {
  const Inputs in{means, scales, rotations, opacities, harmonics, valid, view, centres,
                  intrinsics, near, far, height, width, eps2d, antialiased};
  in.check();
  const int64_t images = in.batch() * in.views(), num = in.num();
  const auto options = means.options();
  at::Tensor means2d = at::empty({images, num, 2}, options);
  at::Tensor conics = at::empty({images, num, 3}, options);
  at::Tensor colors = at::empty({images, num, 3}, options);
  at::Tensor out_opacities = at::empty({images, num}, options);
  at::Tensor depths = at::empty({images, num}, options);
  at::Tensor radii = at::empty({images, num, 2}, options.dtype(at::kInt));
  dispatch(means.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    const splatzoo::Projected<T> out{means2d.data_ptr<T>(),       conics.data_ptr<T>(),
                                     colors.data_ptr<T>(),        out_opacities.data_ptr<T>(),
                                     depths.data_ptr<T>(),        radii.data_ptr<int32_t>()};
    splatzoo::project_forward<T>(in.scene<T>(), out, at::get_num_threads());
  });
  return {means2d, conics, colors, out_opacities, depths, radii};
}

// Returns the gradients of means, scales, rotations, opacities and harmonics, and, with
// camera_grads, of view [B, V, 4, 4] and centres [B, V, 3] (else empty tensors).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
project_backward(const at::Tensor& means, const at::Tensor& scales, const at::Tensor& rotations,
                 const at::Tensor& opacities, const at::Tensor& harmonics, const at::Tensor& valid,
                 const at::Tensor& view, const at::Tensor& centres, const at::Tensor& intrinsics,
                 const at::Tensor& near, const at::Tensor& far, int64_t height, int64_t width,
                 double eps2d, bool antialiased, const at::Tensor& v_means2d,
                 const at::Tensor& v_conics, const at::Tensor& v_colors,
                 const at::Tensor& v_opacities, const at::Tensor& v_depths, bool camera_grads) {
  const Inputs in{means, scales, rotations, opacities, harmonics, valid, view, centres,
                  intrinsics, near, far, height, width, eps2d, antialiased};
  in.check();
  const int64_t images = in.batch() * in.views(), num = in.num();
  const auto dtype = means.scalar_type();
  check_shape(v_means2d, "v_means2d", dtype, {images, num, 2});
  check_shape(v_conics, "v_conics", dtype, {images, num, 3});
  check_shape(v_colors, "v_colors", dtype, {images, num, 3});
  check_shape(v_opacities, "v_opacities", dtype, {images, num});
  check_shape(v_depths, "v_depths", dtype, {images, num});
  at::Tensor g_means = at::empty_like(means), g_scales = at::empty_like(scales);
  at::Tensor g_rotations = at::empty_like(rotations), g_opacities = at::empty_like(opacities);
  at::Tensor g_harmonics = at::empty_like(harmonics);
  at::Tensor g_view = at::empty(camera_grads ? view.sizes() : at::IntArrayRef{0}, view.options());
  at::Tensor g_centres =
      at::empty(camera_grads ? centres.sizes() : at::IntArrayRef{0}, centres.options());
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const splatzoo::ProjectedGrads<T> grads{v_means2d.data_ptr<T>(), v_conics.data_ptr<T>(),
                                            v_colors.data_ptr<T>(), v_opacities.data_ptr<T>(),
                                            v_depths.data_ptr<T>()};
    const splatzoo::SceneGrads<T> out{g_means.data_ptr<T>(),
                                      g_scales.data_ptr<T>(),
                                      g_rotations.data_ptr<T>(),
                                      g_opacities.data_ptr<T>(),
                                      g_harmonics.data_ptr<T>(),
                                      camera_grads ? g_view.data_ptr<T>() : nullptr,
                                      camera_grads ? g_centres.data_ptr<T>() : nullptr};
    splatzoo::project_backward<T>(in.scene<T>(), grads, out, at::get_num_threads());
  });
  return {g_means, g_scales, g_rotations, g_opacities, g_harmonics, g_view, g_centres};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(splatzoo_cpu, m) {
  m.def("project_forward", &project_forward);
  m.def("project_backward", &project_backward);
}
