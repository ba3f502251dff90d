// 3DGS-MCMC's noise on the means, in place: torch.ops.splatzoo_cpu.mcmc_noise.
//
// The refinement fit adds it after every step (models/pipeline/refine/ops.py inject_noise, whose
// PyTorch form is the reference the tests compare against): in PyTorch it is some 30 small tensor
// operations over all the Gaussians (9 ms a step at 100k on 2 threads); here one pass. Like gsplat,
// whose compiled library holds its MCMC helpers beside the rasteriser, it lives in this library.
// Light ATen headers only, as rasterize_cpu_ops.cpp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "ops_checks.h"

namespace {

using splatzoo::check_shape;

// Gaussian n: gate = sigmoid(100 ((1 - sigmoid(logit)) - 0.995)), skipped at gate <= 1e-6;
// step = sample * gate * scaler; means += R diag(exp(2 log_scale)) R^T step, with R the rotation
// of the quaternion (w, x, y, z) normalised (norm clamped at 1e-12, as F.normalize). Double inside.
template <typename T>
void noise(T* means, const T* logits, const T* quats, const T* log_scales, const T* sample,
           double scaler, int64_t num) {
  at::parallel_for(0, num, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      // the gate falls with the logit and passes 1e-6 at -1.789 (gate(-1.7) = 3.2e-7): opaque
      // Gaussians are skipped before the exponentials
      if (!(double(logits[n]) < -1.7)) continue;
      const double opacity = 1.0 / (1.0 + std::exp(-double(logits[n])));
      const double gate = 1.0 / (1.0 + std::exp(-100.0 * ((1.0 - opacity) - 0.995)));
      if (!(gate > 1e-6)) continue;
      const T* q = quats + 4 * n;
      const double norm = std::max(
          std::sqrt(double(q[0]) * q[0] + double(q[1]) * q[1] + double(q[2]) * q[2] +
                    double(q[3]) * q[3]),
          1e-12);
      const double w = q[0] / norm, x = q[1] / norm, y = q[2] / norm, z = q[3] / norm;
      const double r[3][3] = {
          {1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)},
          {2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)},
          {2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)},
      };
      double step[3], local[3];
      for (int i = 0; i < 3; ++i) step[i] = double(sample[3 * n + i]) * gate * scaler;
      for (int j = 0; j < 3; ++j) {  // diag(var) R^T step
        local[j] = (r[0][j] * step[0] + r[1][j] * step[1] + r[2][j] * step[2]) *
                   std::exp(2.0 * double(log_scales[3 * n + j]));
      }
      for (int i = 0; i < 3; ++i) {
        means[3 * n + i] += static_cast<T>(r[i][0] * local[0] + r[i][1] * local[1] +
                                           r[i][2] * local[2]);
      }
    }
  });
}

void mcmc_noise(at::Tensor means, const at::Tensor& logits, const at::Tensor& quats,
                const at::Tensor& log_scales, const at::Tensor& sample, double scaler) {
  TORCH_CHECK(means.dim() == 2, "means must be [N, 3], got ", means.sizes());
  const int64_t num = means.size(0);
  const auto dtype = means.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "mcmc_noise supports float32 and float64, got ", dtype);
  check_shape(means, "means", dtype, {num, 3});
  check_shape(logits, "opacity logits", dtype, {num});
  check_shape(quats, "quaternions", dtype, {num, 4});
  check_shape(log_scales, "log-scales", dtype, {num, 3});
  check_shape(sample, "sample", dtype, {num, 3});
  if (dtype == at::kFloat) {
    noise<float>(means.data_ptr<float>(), logits.data_ptr<float>(), quats.data_ptr<float>(),
                 log_scales.data_ptr<float>(), sample.data_ptr<float>(), scaler, num);
  } else {
    noise<double>(means.data_ptr<double>(), logits.data_ptr<double>(), quats.data_ptr<double>(),
                  log_scales.data_ptr<double>(), sample.data_ptr<double>(), scaler, num);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(splatzoo_cpu, m) { m.def("mcmc_noise", &mcmc_noise); }
