// CPU projection and SH colours of 3D Gaussians, forward and backward (see project_cpu.h).
//
// The forward pass follows models/render/projection.py (project_gaussians) and
// models/core/sh.py (eval_sh_bases) operation by operation where the order is not a matrix
// product's, so both backends make the same culling and bounding-box decisions except within
// rounding of a threshold. The backward pass is the chain rule written out (gsplat's
// persp_proj_vjp, quat_scale_to_covar_vjp, inverse_vjp and add_blur_vjp, in the order of the
// forward) and the SH basis's derivative by forward-mode dual numbers through the same
// recurrence. Work is parallel over Gaussians, each looping over its scene's views, so the
// sums over views need no atomics; the cameras' gradients are summed per block of Gaussians and
// the blocks in order, so no result depends on the thread count.
#include "project_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace splatzoo {
namespace {

constexpr double kAlphaThreshold = 1.0 / 255.0;
constexpr double kBoxExtend = 3.33;
constexpr double kFrustumMargin = 0.15;
constexpr int kMaxDegree = 4;
constexpr int kMaxBases = (kMaxDegree + 1) * (kMaxDegree + 1);

// ------------------------------------------------------------------------- SH basis (any S)
// A value and its derivatives along x, y, z (forward-mode differentiation of the basis).
template <typename T>
struct Dual {
  T v, dx, dy, dz;
};
template <typename T>
inline Dual<T> operator+(Dual<T> a, Dual<T> b) { return {a.v + b.v, a.dx + b.dx, a.dy + b.dy, a.dz + b.dz}; }
template <typename T>
inline Dual<T> operator-(Dual<T> a, Dual<T> b) { return {a.v - b.v, a.dx - b.dx, a.dy - b.dy, a.dz - b.dz}; }
template <typename T>
inline Dual<T> operator*(Dual<T> a, Dual<T> b) {
  return {a.v * b.v, a.dx * b.v + a.v * b.dx, a.dy * b.v + a.v * b.dy, a.dz * b.v + a.v * b.dz};
}
template <typename T>
inline Dual<T> operator*(T k, Dual<T> a) { return {k * a.v, k * a.dx, k * a.dy, k * a.dz}; }
template <typename T>
inline Dual<T> operator/(Dual<T> a, T k) { return {a.v / k, a.dx / k, a.dy / k, a.dz / k}; }

template <typename T>
inline T constant(T, double k) { return static_cast<T>(k); }
template <typename T>
inline Dual<T> constant(Dual<T>, double k) { return {static_cast<T>(k), T(0), T(0), T(0)}; }
template <typename T>
inline T scale(T k, T a) { return k * a; }
template <typename T>
inline Dual<T> scale(T k, Dual<T> a) { return k * a; }

// K_l^m of the orthonormal real basis (sqrt 2 folded in for m != 0), as sh._normalisation.
inline double normalisation(int degree, int order) {
  const int m = std::abs(order);
  double ratio = 1.0;  // (l - m)! / (l + m)!
  for (int k = degree - m + 1; k <= degree + m; ++k) ratio /= k;
  const double k = std::sqrt((2.0 * degree + 1.0) / (4.0 * M_PI) * ratio);
  return order ? k * std::sqrt(2.0) : k;
}

struct BasisConstants {
  double norm[kMaxBases];
  double start[kMaxDegree + 1];  // (-1)^m (2m - 1)!!
  BasisConstants() {
    for (int l = 0, i = 0; l <= kMaxDegree; ++l) {
      for (int order = -l; order <= l; ++order) norm[i++] = normalisation(l, order);
    }
    for (int m = 0; m <= kMaxDegree; ++m) {
      double f = 1.0;
      for (int k = 2 * m - 1; k > 0; k -= 2) f *= k;
      start[m] = (m % 2 ? -1.0 : 1.0) * f;
    }
  }
};
const BasisConstants kBasis;

// The real SH basis at a unit direction (x, y, z), as sh.eval_sh_bases: the azimuthal parts as
// Re and Im of (x + i y)^m, the polar ones by the Legendre recurrence. T is the float type, S is
// T or Dual<T>.
template <typename T, typename S>
void sh_bases(int degree, S x, S y, S z, S* out) {
  const S zero = constant(x, 0.0);
  if (degree == 0) {
    out[0] = constant(x, static_cast<T>(kBasis.norm[0]));
    return;
  }
  S cosines[kMaxDegree + 1], sines[kMaxDegree + 1], polar[kMaxDegree + 1][kMaxDegree + 1];
  cosines[0] = constant(x, 1.0);
  sines[0] = zero;
  cosines[1] = x;
  sines[1] = y;
  for (int m = 2; m <= degree; ++m) {
    cosines[m] = x * cosines[m - 1] - y * sines[m - 1];
    sines[m] = x * sines[m - 1] + y * cosines[m - 1];
  }
  for (int m = 0; m <= degree; ++m) {
    polar[m][m] = constant(x, kBasis.start[m]);
    if (m < degree) polar[m + 1][m] = scale(static_cast<T>(2 * m + 1), z) * polar[m][m];
    for (int l = m + 2; l <= degree; ++l) {
      const S previous = scale(static_cast<T>(2 * l - 1), z) * polar[l - 1][m];
      polar[l][m] = (previous - scale(static_cast<T>(l + m - 1), polar[l - 2][m])) /
                    static_cast<T>(l - m);
    }
  }
  for (int l = 0, i = 0; l <= degree; ++l) {
    for (int order = -l; order <= l; ++order, ++i) {
      const int m = std::abs(order);
      const S part = order == 0 ? polar[l][m] : polar[l][m] * (order > 0 ? cosines[m] : sines[m]);
      out[i] = scale(static_cast<T>(kBasis.norm[i]), part);
    }
  }
}

// The SH degree of a coefficient count (d + 1)^2.
inline int sh_degree(int64_t bases) {
  return static_cast<int>(std::lround(std::sqrt(static_cast<double>(bases)))) - 1;
}

// The view direction centre -> mean as F.normalize makes it, d / max(|d|, 1e-12), into n;
// returns the divisor.
template <typename T>
inline T unit_direction(const T* mean, const T* centre, T* n) {
  const T d[3] = {mean[0] - centre[0], mean[1] - centre[1], mean[2] - centre[2]};
  const T norm = std::max(std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]), T(1e-12));
  for (int k = 0; k < 3; ++k) n[k] = d[k] / norm;
  return norm;
}

// max(SH + 0.5, 0) before the clamp, of channel ch: sum_k h[ch, k] basis_k.
template <typename T>
inline T raw_colour(const T* h, const T* basis, int64_t bases, int ch) {
  T sum = T(0);
  for (int64_t k = 0; k < bases; ++k) sum += h[ch * bases + k] * basis[k];
  return sum + T(0.5);
}

// ------------------------------------------------------------------------- one (view, Gaussian)
template <typename T>
struct Camera {
  T r[9], t[3], fx, fy, cx, cy, near, far, centre[3];
  T lo_x, lo_y, hi_x, hi_y;  // the slope limits of the Jacobian (FRUSTUM_MARGIN)
};

template <typename T>
Camera<T> camera(const Scene<T>& s, int64_t bv) {
  Camera<T> c;
  const T* w = s.view + 16 * bv;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) c.r[3 * i + j] = w[4 * i + j];
    c.t[i] = w[4 * i + 3];
    c.centre[i] = s.centres[3 * bv + i];
  }
  const T* k = s.intrinsics + 9 * bv;
  c.fx = k[0];
  c.fy = k[4];
  c.cx = k[2];
  c.cy = k[5];
  c.near = s.near[bv];
  c.far = s.far[bv];
  const T below = static_cast<T>(-kFrustumMargin), above = static_cast<T>(1.0 + kFrustumMargin);
  const T width = T(s.width), height = T(s.height);
  c.lo_x = (below * width - c.cx) / c.fx;
  c.lo_y = (below * height - c.cy) / c.fy;
  c.hi_x = (above * width - c.cx) / c.fx;
  c.hi_y = (above * height - c.cy) / c.fy;
  return c;
}

// Every camera of the batch ([B * V]), built once per call rather than per Gaussian.
template <typename T>
std::vector<Camera<T>> cameras_of(const Scene<T>& s) {
  std::vector<Camera<T>> cameras(s.batch * s.views);
  for (int64_t bv = 0; bv < s.batch * s.views; ++bv) cameras[bv] = camera(s, bv);
  return cameras;
}

// R diag(s) of a Gaussian (row-major), the normalised quaternion and its norm.
template <typename T>
struct Shape {
  T m[9], r[9], q[4], qnorm;
};

template <typename T>
Shape<T> shape(const T* scale3, const T* quat) {
  Shape<T> g;
  g.qnorm = std::max(std::sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] +
                               quat[3] * quat[3]),
                     T(1e-12));
  for (int i = 0; i < 4; ++i) g.q[i] = quat[i] / g.qnorm;
  const T w = g.q[0], x = g.q[1], y = g.q[2], z = g.q[3];
  const T r[9] = {T(1) - T(2) * (y * y + z * z), T(2) * (x * y - w * z), T(2) * (x * z + w * y),
                  T(2) * (x * y + w * z), T(1) - T(2) * (x * x + z * z), T(2) * (y * z - w * x),
                  T(2) * (x * z - w * y), T(2) * (y * z + w * x), T(1) - T(2) * (x * x + y * y)};
  for (int i = 0; i < 9; ++i) {
    g.r[i] = r[i];
    g.m[i] = r[i] * scale3[i % 3];
  }
  return g;
}

// The forward quantities of one (view, Gaussian) pair that the backward pass needs again.
template <typename T>
struct Pair {
  T p[3];        // camera-frame centre
  T zs;          // z, or 1 when outside [near, far]
  bool in_range, clamp_x, clamp_y;
  T sx, sy;      // the (limited) slopes
  T a[6];        // J W (2 x 3)
  T f[6];        // J W R S (2 x 3)
  T c00, c01, c11;  // the 2D covariance (before the dilation)
  T shared;         // (c01 + c10) / 2, as projection._conics symmetrises it
  T d0, d1, det;    // the dilated diagonal and its determinant (1 when not invertible)
  bool invertible;
  T compensation;
};

template <typename T>
Pair<T> project_pair(const Camera<T>& c, const Shape<T>& g, const T* mean, T eps2d) {
  Pair<T> q;
  for (int i = 0; i < 3; ++i) {
    q.p[i] = c.r[3 * i] * mean[0] + c.r[3 * i + 1] * mean[1] + c.r[3 * i + 2] * mean[2] + c.t[i];
  }
  q.in_range = q.p[2] >= c.near && q.p[2] <= c.far;
  q.zs = q.in_range ? q.p[2] : T(1);
  const T raw_x = q.p[0] / q.zs, raw_y = q.p[1] / q.zs;
  q.sx = std::min(std::max(raw_x, c.lo_x), c.hi_x);
  q.sy = std::min(std::max(raw_y, c.lo_y), c.hi_y);
  q.clamp_x = q.sx != raw_x;
  q.clamp_y = q.sy != raw_y;
  // J = [[fx / z, 0, -fx sx / z], [0, fy / z, -fy sy / z]]; A = J W
  const T j00 = c.fx / q.zs, j02 = -c.fx * q.sx / q.zs, j11 = c.fy / q.zs, j12 = -c.fy * q.sy / q.zs;
  for (int k = 0; k < 3; ++k) {
    q.a[k] = j00 * c.r[k] + j02 * c.r[6 + k];
    q.a[3 + k] = j11 * c.r[3 + k] + j12 * c.r[6 + k];
  }
  for (int row = 0; row < 2; ++row) {
    for (int k = 0; k < 3; ++k) {
      const T* a = q.a + 3 * row;
      q.f[3 * row + k] = a[0] * g.m[k] + a[1] * g.m[3 + k] + a[2] * g.m[6 + k];
    }
  }
  q.c00 = q.f[0] * q.f[0] + q.f[1] * q.f[1] + q.f[2] * q.f[2];
  q.c01 = q.f[0] * q.f[3] + q.f[1] * q.f[4] + q.f[2] * q.f[5];
  q.c11 = q.f[3] * q.f[3] + q.f[4] * q.f[4] + q.f[5] * q.f[5];
  q.d0 = q.c00 + eps2d;
  q.d1 = q.c11 + eps2d;
  q.shared = T(0.5) * (q.c01 + q.c01);
  const T det = q.d0 * q.d1 - q.shared * q.shared;
  q.invertible = det > T(0);
  q.det = q.invertible ? det : T(1);
  const T off = q.c01 * q.c01;
  const T area = q.c00 * q.c11 - off;
  const T dilated = (q.c00 + eps2d) * (q.c11 + eps2d) - off;
  q.compensation = std::sqrt(std::max(area / std::max(dilated, T(1e-10)), T(0)));
  return q;
}

// The bounding-box half sizes of a projected pair, 0 when culled (projection._box_radii and the
// image test of project_gaussians).
template <typename T>
void box_radii(const Pair<T>& q, T opacity, T u, T v, int64_t width, int64_t height,
               int32_t* radii) {
  radii[0] = radii[1] = 0;
  if (!q.in_range || !q.invertible || !(opacity >= static_cast<T>(kAlphaThreshold))) return;
  const T ratio = std::max(opacity / static_cast<T>(kAlphaThreshold), T(1));
  const T extend = std::min(std::sqrt(T(2) * std::log(ratio)), static_cast<T>(kBoxExtend));
  const T rx = std::ceil(extend * std::sqrt(std::max(q.d0, T(0))));
  const T ry = std::ceil(extend * std::sqrt(std::max(q.d1, T(0))));
  if (!(rx > T(0) || ry > T(0))) return;
  if (!(u + rx > T(0) && u - rx < T(width) && v + ry > T(0) && v - ry < T(height))) return;
  radii[0] = static_cast<int32_t>(rx);
  radii[1] = static_cast<int32_t>(ry);
}

}  // namespace

template <typename T>
void project_forward(const Scene<T>& s, const Projected<T>& out, int threads) {
  const int degree = sh_degree(s.bases);
  const std::vector<Camera<T>> cameras = cameras_of(s);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t flat = 0; flat < s.batch * s.num; ++flat) {
    const int64_t b = flat / s.num, n = flat % s.num;
    const T* mean = s.means + 3 * flat;
    const Shape<T> g = shape(s.scales + 3 * flat, s.rotations + 4 * flat);
    const T* h = s.harmonics + 3 * s.bases * flat;
    T basis[kMaxBases], n_view[3];
    for (int64_t v = 0; v < s.views; ++v) {
      const Camera<T>& c = cameras[b * s.views + v];
      const Pair<T> q = project_pair(c, g, mean, s.eps2d);
      const int64_t slot = (b * s.views + v) * s.num + n;
      const T u = c.fx * q.p[0] / q.zs + c.cx, w = c.fy * q.p[1] / q.zs + c.cy;
      out.means2d[2 * slot] = u;
      out.means2d[2 * slot + 1] = w;
      T* conic = out.conics + 3 * slot;
      conic[0] = q.d1 / q.det;
      conic[1] = -q.shared / q.det;
      conic[2] = q.d0 / q.det;
      out.depths[slot] = q.p[2];
      const T opacity = s.opacities[flat] * (s.antialiased ? q.compensation : T(1));
      out.opacities[slot] = opacity;
      box_radii(q, opacity, u, w, s.width, s.height, out.radii + 2 * slot);
      if (!s.valid[flat]) out.radii[2 * slot] = out.radii[2 * slot + 1] = 0;
      unit_direction(mean, c.centre, n_view);
      sh_bases<T, T>(degree, n_view[0], n_view[1], n_view[2], basis);
      for (int ch = 0; ch < 3; ++ch) {
        out.colors[3 * slot + ch] = std::max(raw_colour(h, basis, s.bases, ch), T(0));
      }
    }
  }
}

namespace {

// d loss / d 2D covariance (c00, the off-diagonal value c01 = c10, c11) of one pair, from its
// conic's and compensation's gradients (projection._conics and opacity_compensation backward).
template <typename T>
void covariance_grad(const Pair<T>& q, const T* v_conic, T v_compensation, T eps2d, double* v_cov) {
  const double det = q.det, d0 = q.d0, d1 = q.d1, shared = q.c01;
  double v_d0 = v_conic[2] / det, v_d1 = v_conic[0] / det, v_shared = -v_conic[1] / det;
  if (q.invertible) {
    const double v_det = -(v_conic[0] * d1 - v_conic[1] * shared + v_conic[2] * d0) / (det * det);
    v_d0 += v_det * d1;
    v_d1 += v_det * d0;
    v_shared += -2.0 * shared * v_det;
  }
  v_cov[0] = v_d0;
  v_cov[1] = v_shared;  // shared = (c01 + c10) / 2, and c01 = c10 is one value here
  v_cov[2] = v_d1;
  if (v_compensation != T(0)) {
    const double c00 = q.c00, c11 = q.c11, off = q.c01;
    const double area = c00 * c11 - off * off;
    const double dilated = (c00 + eps2d) * (c11 + eps2d) - off * off;
    const double clamped = std::max(dilated, 1e-10);
    const double v_ratio = v_compensation * 0.5 / (double(q.compensation) + 1e-6);
    const double v_area = v_ratio / clamped;
    const double v_dilated = dilated >= 1e-10 ? -v_ratio * area / (clamped * clamped) : 0.0;
    v_cov[0] += v_area * c11 + v_dilated * (c11 + eps2d);
    v_cov[2] += v_area * c00 + v_dilated * (c00 + eps2d);
    v_cov[1] += -2.0 * off * (v_area + v_dilated);
  }
}

// Adds one pair's gradients to the Gaussian's mean, to v_m (d / d R diag(s), row-major) and, when
// v_camera is not null, to the camera's world-to-camera rotation W (9, row-major) and translation.
template <typename T>
void pair_grad(const Camera<T>& c, const Shape<T>& g, const Pair<T>& q, const T* mean,
               const double* v_cov, const T* v_uv, T v_depth, double* v_mean, double* v_m,
               double* v_camera) {
  // cov = F F^T: v_F = (v_C + v_C^T) F
  double v_f[6];
  for (int k = 0; k < 3; ++k) {
    v_f[k] = 2.0 * v_cov[0] * q.f[k] + v_cov[1] * q.f[3 + k];
    v_f[3 + k] = 2.0 * v_cov[2] * q.f[3 + k] + v_cov[1] * q.f[k];
  }
  // F = A M: v_A = v_F M^T, v_M = A^T v_F
  double v_a[6];
  for (int row = 0; row < 2; ++row) {
    for (int i = 0; i < 3; ++i) {
      v_a[3 * row + i] = v_f[3 * row] * g.m[3 * i] + v_f[3 * row + 1] * g.m[3 * i + 1] +
                         v_f[3 * row + 2] * g.m[3 * i + 2];
    }
  }
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) v_m[3 * i + j] += q.a[i] * v_f[j] + q.a[3 + i] * v_f[3 + j];
  }
  // A = J W: v_J = v_A W^T (only J's four non-zero entries)
  auto v_j = [&](int row, int col) {
    return v_a[3 * row] * c.r[3 * col] + v_a[3 * row + 1] * c.r[3 * col + 1] +
           v_a[3 * row + 2] * c.r[3 * col + 2];
  };
  const double z = q.zs, fx = c.fx, fy = c.fy;
  const double v_j00 = v_j(0, 0), v_j02 = v_j(0, 2), v_j11 = v_j(1, 1), v_j12 = v_j(1, 2);
  double v_z = (-v_j00 * fx + v_j02 * fx * q.sx - v_j11 * fy + v_j12 * fy * q.sy) / (z * z);
  double v_x = 0.0, v_y = 0.0;
  const double v_sx = -v_j02 * fx / z, v_sy = -v_j12 * fy / z;
  if (!q.clamp_x) {
    v_x += v_sx / z;
    v_z -= v_sx * q.p[0] / (z * z);
  }
  if (!q.clamp_y) {
    v_y += v_sy / z;
    v_z -= v_sy * q.p[1] / (z * z);
  }
  // the pixel centre fx x / z + cx
  v_x += v_uv[0] * fx / z;
  v_y += v_uv[1] * fy / z;
  v_z -= (v_uv[0] * fx * q.p[0] + v_uv[1] * fy * q.p[1]) / (z * z);
  double v_p[3] = {v_x, v_y, q.in_range ? v_z + v_depth : double(v_depth)};
  for (int k = 0; k < 3; ++k) {
    v_mean[k] += c.r[k] * v_p[0] + c.r[3 + k] * v_p[1] + c.r[6 + k] * v_p[2];
  }
  if (v_camera == nullptr) return;
  // p = W mean + t, and A = J W (J's non-zero entries: J00, J02, J11, J12)
  const double j00 = fx / z, j02 = -fx * q.sx / z, j11 = fy / z, j12 = -fy * q.sy / z;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) v_camera[3 * i + j] += v_p[i] * mean[j];
    v_camera[9 + i] += v_p[i];
    v_camera[i] += j00 * v_a[i];
    v_camera[3 + i] += j11 * v_a[3 + i];
    v_camera[6 + i] += j02 * v_a[i] + j12 * v_a[3 + i];
  }
}

// d / d quaternion (raw, before normalisation) and d / d scales from d / d (R diag(s)).
template <typename T>
void shape_grad(const Shape<T>& g, const T* scale3, const double* v_m, T* v_scale, T* v_quat) {
  double v_r[9];
  for (int i = 0; i < 9; ++i) v_r[i] = v_m[i] * scale3[i % 3];
  for (int j = 0; j < 3; ++j) {
    v_scale[j] = static_cast<T>(v_m[j] * g.r[j] + v_m[3 + j] * g.r[3 + j] + v_m[6 + j] * g.r[6 + j]);
  }
  const double w = g.q[0], x = g.q[1], y = g.q[2], z = g.q[3];
  const double v_n[4] = {
      2.0 * (-z * v_r[1] + y * v_r[2] + z * v_r[3] - x * v_r[5] - y * v_r[6] + x * v_r[7]),
      2.0 * (y * v_r[1] + z * v_r[2] + y * v_r[3] - 2.0 * x * v_r[4] - w * v_r[5] + z * v_r[6] +
             w * v_r[7] - 2.0 * x * v_r[8]),
      2.0 * (-2.0 * y * v_r[0] + x * v_r[1] + w * v_r[2] + x * v_r[3] + z * v_r[5] - w * v_r[6] +
             z * v_r[7] - 2.0 * y * v_r[8]),
      2.0 * (-2.0 * z * v_r[0] - w * v_r[1] + x * v_r[2] + w * v_r[3] - 2.0 * z * v_r[4] +
             y * v_r[5] + x * v_r[6] + y * v_r[7])};
  // q / max(|q|, eps): the component along q cancels (none when the norm was floored)
  const double along = g.qnorm > T(1e-12)
                           ? w * v_n[0] + x * v_n[1] + y * v_n[2] + z * v_n[3]
                           : 0.0;
  for (int i = 0; i < 4; ++i) v_quat[i] = static_cast<T>((v_n[i] - g.q[i] * along) / g.qnorm);
}

// Adds the SH colour's gradient of one pair to v_h [3, K], v_mean and, when not null, the
// camera centre's v_centre (the direction is mean - centre).
template <typename T>
void colour_grad(const Camera<T>& c, const T* mean, const T* h, int64_t bases, int degree,
                 const T* v_colour, double* v_h, double* v_mean, double* v_centre) {
  T n[3];
  const T norm = unit_direction(mean, c.centre, n);
  Dual<T> basis[kMaxBases];
  sh_bases<T, Dual<T>>(degree, {n[0], T(1), T(0), T(0)}, {n[1], T(0), T(1), T(0)},
                       {n[2], T(0), T(0), T(1)}, basis);
  T values[kMaxBases];
  for (int64_t k = 0; k < bases; ++k) values[k] = basis[k].v;
  double v_raw[3];
  for (int ch = 0; ch < 3; ++ch) {  // clamp_min(0) passes the gradient where raw >= 0
    v_raw[ch] = raw_colour(h, values, bases, ch) >= T(0) ? double(v_colour[ch]) : 0.0;
  }
  double v_n[3] = {0.0, 0.0, 0.0};
  for (int64_t k = 0; k < bases; ++k) {
    double v_basis = 0.0;
    for (int ch = 0; ch < 3; ++ch) {
      v_h[ch * bases + k] += v_raw[ch] * values[k];
      v_basis += v_raw[ch] * h[ch * bases + k];
    }
    v_n[0] += v_basis * basis[k].dx;
    v_n[1] += v_basis * basis[k].dy;
    v_n[2] += v_basis * basis[k].dz;
  }
  const double along = norm > T(1e-12) ? n[0] * v_n[0] + n[1] * v_n[1] + n[2] * v_n[2] : 0.0;
  for (int k = 0; k < 3; ++k) {
    const double v_d = (v_n[k] - n[k] * along) / norm;
    v_mean[k] += v_d;
    if (v_centre != nullptr) v_centre[k] -= v_d;
  }
}

// Gaussians per block of the backward pass: each block sums its cameras' gradients on its own, and
// the blocks are added in order, so the cameras' gradients do not depend on the thread count.
constexpr int64_t kBlock = 1024;
constexpr int kCameraGrads = 15;  // W (9), t (3), centre (3)

// The gradients of one Gaussian (flat = b * N + n), its cameras' added to camera_block
// [B * V, kCameraGrads] when not null.
template <typename T>
void gaussian_grad(const Scene<T>& s, const std::vector<Camera<T>>& cameras,
                   const ProjectedGrads<T>& in, const SceneGrads<T>& out, int64_t flat, int degree,
                   double* camera_block) {
  const int64_t b = flat / s.num, n = flat % s.num;
  const T* mean = s.means + 3 * flat;
  const T* scale3 = s.scales + 3 * flat;
  const Shape<T> g = shape(scale3, s.rotations + 4 * flat);
  const T* h = s.harmonics + 3 * s.bases * flat;
  double v_mean[3] = {0, 0, 0}, v_m[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0}, v_opacity = 0.0;
  double v_h[3 * kMaxBases] = {};
  bool any_shape = false;
  for (int64_t v = 0; v < s.views; ++v) {
    const int64_t slot = (b * s.views + v) * s.num + n;
    const T* v_uv = in.means2d + 2 * slot;
    const T* v_conic = in.conics + 3 * slot;
    const T* v_colour = in.colors + 3 * slot;
    const T v_depth = in.depths[slot], v_out_opacity = in.opacities[slot];
    const bool geometry = v_uv[0] != T(0) || v_uv[1] != T(0) || v_conic[0] != T(0) ||
                          v_conic[1] != T(0) || v_conic[2] != T(0) || v_depth != T(0) ||
                          (s.antialiased && v_out_opacity != T(0));
    const bool colour = v_colour[0] != T(0) || v_colour[1] != T(0) || v_colour[2] != T(0);
    if (!geometry && !colour && v_out_opacity == T(0)) continue;  // not seen in this view
    const Camera<T>& c = cameras[b * s.views + v];
    double* v_camera =
        camera_block == nullptr ? nullptr : camera_block + (b * s.views + v) * kCameraGrads;
    if (geometry) {
      const Pair<T> q = project_pair(c, g, mean, s.eps2d);
      const T compensation = s.antialiased ? q.compensation : T(1);
      v_opacity += double(v_out_opacity) * compensation;
      const T v_compensation = s.antialiased ? v_out_opacity * s.opacities[flat] : T(0);
      double v_cov[3];
      covariance_grad(q, v_conic, v_compensation, s.eps2d, v_cov);
      pair_grad(c, g, q, mean, v_cov, v_uv, v_depth, v_mean, v_m, v_camera);
      any_shape = true;
    } else {
      v_opacity += double(v_out_opacity);
    }
    if (colour) {
      colour_grad(c, mean, h, s.bases, degree, v_colour, v_h, v_mean,
                  v_camera == nullptr ? nullptr : v_camera + 12);
    }
  }
  for (int k = 0; k < 3; ++k) out.means[3 * flat + k] = static_cast<T>(v_mean[k]);
  out.opacities[flat] = static_cast<T>(v_opacity);
  for (int64_t k = 0; k < 3 * s.bases; ++k) {
    out.harmonics[3 * s.bases * flat + k] = static_cast<T>(v_h[k]);
  }
  if (any_shape) {
    shape_grad(g, scale3, v_m, out.scales + 3 * flat, out.rotations + 4 * flat);
  } else {
    for (int k = 0; k < 3; ++k) out.scales[3 * flat + k] = T(0);
    for (int k = 0; k < 4; ++k) out.rotations[4 * flat + k] = T(0);
  }
}

}  // namespace

template <typename T>
void project_backward(const Scene<T>& s, const ProjectedGrads<T>& in, const SceneGrads<T>& out,
                      int threads) {
  const int degree = sh_degree(s.bases);
  const std::vector<Camera<T>> cameras = cameras_of(s);
  const int64_t total = s.batch * s.num, blocks = (total + kBlock - 1) / kBlock;
  const int64_t count = s.batch * s.views;
  const bool camera_grads = out.view != nullptr;
  std::vector<double> partial(camera_grads ? blocks * count * kCameraGrads : 0, 0.0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t block = 0; block < blocks; ++block) {
    double* camera_block = camera_grads ? partial.data() + block * count * kCameraGrads : nullptr;
    for (int64_t flat = block * kBlock; flat < std::min(total, (block + 1) * kBlock); ++flat) {
      gaussian_grad(s, cameras, in, out, flat, degree, camera_block);
    }
  }
  if (!camera_grads) return;
  for (int64_t camera = 0; camera < count; ++camera) {
    double sum[kCameraGrads] = {};
    for (int64_t block = 0; block < blocks; ++block) {
      const double* p = partial.data() + (block * count + camera) * kCameraGrads;
      for (int k = 0; k < kCameraGrads; ++k) sum[k] += p[k];
    }
    T* view = out.view + 16 * camera;  // rows 0-2: [W | t]; row 3 has no gradient
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) view[4 * i + j] = static_cast<T>(sum[3 * i + j]);
      view[4 * i + 3] = static_cast<T>(sum[9 + i]);
    }
    for (int j = 0; j < 4; ++j) view[12 + j] = T(0);
    for (int k = 0; k < 3; ++k) out.centres[3 * camera + k] = static_cast<T>(sum[12 + k]);
  }
}

#define SPLATZOO_INSTANTIATE(T)                                                              \
  template void project_forward<T>(const Scene<T>&, const Projected<T>&, int);               \
  template void project_backward<T>(const Scene<T>&, const ProjectedGrads<T>&,               \
                                    const SceneGrads<T>&, int);
SPLATZOO_INSTANTIATE(float)
SPLATZOO_INSTANTIATE(double)
#undef SPLATZOO_INSTANTIATE

}  // namespace splatzoo
