// CPU tile rasteriser: binning, front-to-back forward, back-to-front backward (gsplat's scheme).
//
// The arithmetic of one (pixel, Gaussian) evaluation follows the torch backend of
// models/render.py operation by operation (built with -ffp-contract=off, so no fused
// multiply-adds), so both make the same skip and stop decisions:
//   d = mean - pixel centre,  -sigma = ((-c/2) dy) dy + ((-a/2) dx) dx + dy ((-b) dx),
//   alpha = min(o exp(max(-sigma, -20)), 0.999),  skipped when sigma < 0 or alpha < 1/255,
//   a pixel stops at the first Gaussian that takes its transmittance to 1e-4 or below (that
//   Gaussian not composited).
#include "rasterize_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace splatzoo {
namespace {

constexpr double kAlphaThreshold = 1.0 / 255.0;
constexpr double kMaxAlpha = 0.999;
constexpr double kTransmittanceMin = 1e-4;
constexpr double kNegSigmaFloor = -20.0;

template <typename T>
struct Splat {
  T x, y, neg_half_a, neg_b, neg_half_c, opacity;
};

template <typename T>
inline Splat<T> load_splat(const Splats<T>& s, int64_t slot) {
  const T* m = s.means2d + 2 * slot;
  const T* c = s.conics + 3 * slot;
  return {m[0], m[1], T(-0.5) * c[0], -c[1], T(-0.5) * c[2], s.opacities[slot]};
}

// -sigma at offset (dx, dy) = mean - pixel centre, in the torch backend's order of operations.
template <typename T>
inline T neg_sigma(const Splat<T>& g, T dx, T dy) {
  const T quad_x = g.neg_half_a * dx * dx;
  const T quad_y = g.neg_half_c * dy * dy;
  const T cross_x = g.neg_b * dx;
  return (quad_y + quad_x) + dy * cross_x;
}

// The pixel box [x0, x1) x [y0, y1) of a Gaussian inside a tile: its bounding box (radii, which
// holds every pixel with alpha >= 1/255) widened by a pixel against rounding.
struct Box {
  int64_t x0, x1, y0, y1;
};

template <typename T>
inline Box pixel_box(const Splats<T>& s, int64_t slot, int64_t tx0, int64_t tx1, int64_t ty0,
                     int64_t ty1) {
  const double x = s.means2d[2 * slot], y = s.means2d[2 * slot + 1];
  const double rx = s.radii[2 * slot], ry = s.radii[2 * slot + 1];
  auto lo = [](double v, int64_t a, int64_t b) {
    return static_cast<int64_t>(std::clamp(std::floor(v) - 1.0, double(a), double(b)));
  };
  auto hi = [](double v, int64_t a, int64_t b) {
    return static_cast<int64_t>(std::clamp(std::ceil(v) + 2.0, double(a), double(b)));
  };
  return {lo(x - rx, tx0, tx1), hi(x + rx, tx0, tx1), lo(y - ry, ty0, ty1), hi(y + ry, ty0, ty1)};
}

// Minimum of sigma over the box [lo, hi] of offsets (0 when the box holds the mean): the
// quadratic is convex, so otherwise the minimum lies on an edge (as _min_sigma_over_boxes).
inline double min_sigma_over_box(double lo_x, double lo_y, double hi_x, double hi_y, double a,
                                 double b, double c) {
  if (lo_x <= 0 && hi_x >= 0 && lo_y <= 0 && hi_y >= 0) return 0.0;
  auto sigma = [&](double dx, double dy) { return 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy; };
  double best = std::numeric_limits<double>::infinity();
  for (double x : {lo_x, hi_x}) {
    const double dy = std::min(std::max(-b * x / c, lo_y), hi_y);
    best = std::min(best, sigma(x, dy));
  }
  for (double y : {lo_y, hi_y}) {
    const double dx = std::min(std::max(-b * y / a, lo_x), hi_x);
    best = std::min(best, sigma(dx, y));
  }
  return best;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

template <typename T>
Bins bin_tiles(const Splats<T>& s, int threads) {
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y;
  std::vector<std::vector<int32_t>> per_image_ids(s.images);
  std::vector<std::vector<int64_t>> per_image_counts(s.images);

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t image = 0; image < s.images; ++image) {
    const int64_t base = image * s.num;
    // Visible slots in depth order, ties by slot index (the torch backend's stable sort).
    std::vector<int32_t> order;
    for (int64_t n = 0; n < s.num; ++n) {
      const int32_t* r = s.radii + 2 * (base + n);
      if (r[0] > 0 || r[1] > 0) order.push_back(static_cast<int32_t>(n));
    }
    const T* depth = s.depths + base;
    std::sort(order.begin(), order.end(), [depth](int32_t i, int32_t j) {
      return depth[i] < depth[j] || (depth[i] == depth[j] && i < j);
    });
    // (tile, slot) intersections in depth order: gsplat's tile range of the bounding box
    // (float32 arithmetic as its kernel), minus tiles where alpha < 1/255 at every pixel centre.
    std::vector<int32_t> hit_tile, hit_slot;
    const float tile_f = static_cast<float>(s.tile);
    for (int32_t n : order) {
      const int64_t slot = base + n;
      const float cx = static_cast<float>(s.means2d[2 * slot]) / tile_f;
      const float cy = static_cast<float>(s.means2d[2 * slot + 1]) / tile_f;
      const float ex = static_cast<float>(s.radii[2 * slot]) / tile_f;
      const float ey = static_cast<float>(s.radii[2 * slot + 1]) / tile_f;
      auto range = [](float v, int64_t upper, bool up) {
        const float r = up ? std::ceil(v) : std::floor(v);
        if (!(r > 0.0f)) return int64_t(0);  // also NaN
        return std::min(static_cast<int64_t>(std::min(r, 1e9f)), upper);
      };
      const int64_t x_lo = range(cx - ex, tiles_x, false), x_hi = range(cx + ex, tiles_x, true);
      const int64_t y_lo = range(cy - ey, tiles_y, false), y_hi = range(cy + ey, tiles_y, true);
      if (x_lo >= x_hi || y_lo >= y_hi) continue;
      const double mx = s.means2d[2 * slot], my = s.means2d[2 * slot + 1];
      const double a = s.conics[3 * slot], b = s.conics[3 * slot + 1], c = s.conics[3 * slot + 2];
      const double reach = std::log(static_cast<double>(s.opacities[slot]) / kAlphaThreshold);
      const double limit = reach + 1e-3 * (1.0 + std::abs(reach));
      for (int64_t ty = y_lo; ty < y_hi; ++ty) {
        const double lo_y = ty * s.tile + 0.5 - my;
        const double hi_y = std::min((ty + 1) * s.tile, s.height) - 0.5 - my;
        for (int64_t tx = x_lo; tx < x_hi; ++tx) {
          const double lo_x = tx * s.tile + 0.5 - mx;
          const double hi_x = std::min((tx + 1) * s.tile, s.width) - 0.5 - mx;
          if (min_sigma_over_box(lo_x, lo_y, hi_x, hi_y, a, b, c) <= limit) {
            hit_tile.push_back(static_cast<int32_t>(ty * tiles_x + tx));
            hit_slot.push_back(n);
          }
        }
      }
    }
    // Counting sort by tile, stable: each tile's list stays in depth order.
    std::vector<int64_t> counts(tiles + 1, 0);
    for (int32_t t : hit_tile) ++counts[t + 1];
    std::partial_sum(counts.begin(), counts.end(), counts.begin());
    std::vector<int64_t> cursor(counts.begin(), counts.end() - 1);
    std::vector<int32_t> ids(hit_tile.size());
    for (size_t k = 0; k < hit_tile.size(); ++k) ids[cursor[hit_tile[k]]++] = hit_slot[k];
    per_image_ids[image] = std::move(ids);
    per_image_counts[image] = std::move(counts);
  }

  Bins bins;
  bins.offsets.assign(s.images * tiles + 1, 0);
  int64_t total = 0;
  for (int64_t image = 0; image < s.images; ++image) {
    for (int64_t t = 0; t < tiles; ++t) {
      bins.offsets[image * tiles + t] = total + per_image_counts[image][t];
    }
    total += static_cast<int64_t>(per_image_ids[image].size());
  }
  bins.offsets[s.images * tiles] = total;
  bins.ids.reserve(total);
  for (auto& ids : per_image_ids) bins.ids.insert(bins.ids.end(), ids.begin(), ids.end());
  return bins;
}

template <typename T>
void rasterize_forward(const Splats<T>& s, const BinsView& bins, T* out, T* t_final, int32_t* last,
                       int threads) {
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y, plane = s.height * s.width, ts = s.tile;
  const T alpha_threshold = static_cast<T>(kAlphaThreshold);
  const T max_alpha = static_cast<T>(kMaxAlpha);
  const T t_min = static_cast<T>(kTransmittanceMin);
  const T floor = static_cast<T>(kNegSigmaFloor);

#pragma omp parallel num_threads(threads)
  {
    std::vector<T> trans(ts * ts), acc(4 * ts * ts);
    std::vector<int32_t> stop(ts * ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t flat = 0; flat < s.images * tiles; ++flat) {
      const int64_t image = flat / tiles, tile = flat % tiles;
      const int64_t x0 = (tile % tiles_x) * ts, y0 = (tile / tiles_x) * ts;
      const int64_t x1 = std::min(x0 + ts, s.width), y1 = std::min(y0 + ts, s.height);
      const int64_t start = bins.offsets[flat], end = bins.offsets[flat + 1];
      const int32_t length = static_cast<int32_t>(end - start);
      std::fill(trans.begin(), trans.end(), T(1));
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(stop.begin(), stop.end(), length);
      int64_t alive = (x1 - x0) * (y1 - y0);
      const int64_t base = image * s.num;
      for (int64_t k = start; k < end && alive > 0; ++k) {
        const int64_t slot = base + bins.ids[k];
        const Splat<T> g = load_splat(s, slot);
        const T* color = s.colors + 3 * slot;
        const T depth = s.depths[slot];
        const Box box = pixel_box(s, slot, x0, x1, y0, y1);
        const int32_t position = static_cast<int32_t>(k - start);
        for (int64_t py = box.y0; py < box.y1; ++py) {
          const T dy = g.y - (static_cast<T>(py) + T(0.5));
          for (int64_t px = box.x0; px < box.x1; ++px) {
            const int64_t p = (py - y0) * ts + (px - x0);
            if (stop[p] != length) continue;  // stopped earlier
            const T dx = g.x - (static_cast<T>(px) + T(0.5));
            const T ns = neg_sigma(g, dx, dy);
            if (ns > T(0)) continue;
            const T alpha = std::min(g.opacity * std::exp(std::max(ns, floor)), max_alpha);
            if (alpha < alpha_threshold) continue;
            const T next = trans[p] * (T(1) - alpha);
            if (next <= t_min) {
              stop[p] = position;
              --alive;
              continue;
            }
            const T weight = alpha * trans[p];
            T* a = acc.data() + 4 * p;
            a[0] += weight * color[0];
            a[1] += weight * color[1];
            a[2] += weight * color[2];
            a[3] += weight * depth;
            trans[p] = next;
          }
        }
      }
      T* image_out = out + image * 5 * plane;
      for (int64_t py = y0; py < y1; ++py) {
        for (int64_t px = x0; px < x1; ++px) {
          const int64_t p = (py - y0) * ts + (px - x0), q = py * s.width + px;
          for (int c = 0; c < 4; ++c) image_out[c * plane + q] = acc[4 * p + c];
          image_out[4 * plane + q] = T(1) - trans[p];
          t_final[image * plane + q] = trans[p];
          last[image * plane + q] = stop[p];
        }
      }
    }
  }
}

template <typename T>
void rasterize_backward(const Splats<T>& s, const BinsView& bins, const T* t_final,
                        const int32_t* last, const T* grad_out, double* grads, int threads) {
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y, plane = s.height * s.width, ts = s.tile;
  const T alpha_threshold = static_cast<T>(kAlphaThreshold);
  const T max_alpha = static_cast<T>(kMaxAlpha);
  const T floor = static_cast<T>(kNegSigmaFloor);
  const int64_t total = bins.total;
  constexpr int kGrads = 10;
  // Per-intersection gradients: each entry belongs to one tile, so threads never share one and
  // the result does not depend on the schedule.
  std::vector<double> entry(total * kGrads, 0.0);

#pragma omp parallel num_threads(threads)
  {
    // Per pixel: transmittance after the entries not yet visited (walking back), the colour and
    // depth composited behind them, the output gradients and the final transmittance.
    std::vector<double> trans(ts * ts), behind(4 * ts * ts), grad(5 * ts * ts), t_end(ts * ts);
    std::vector<int32_t> count(ts * ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t flat = 0; flat < s.images * tiles; ++flat) {
      const int64_t start = bins.offsets[flat], end = bins.offsets[flat + 1];
      if (start == end) continue;
      const int64_t image = flat / tiles, tile = flat % tiles;
      const int64_t x0 = (tile % tiles_x) * ts, y0 = (tile / tiles_x) * ts;
      const int64_t x1 = std::min(x0 + ts, s.width), y1 = std::min(y0 + ts, s.height);
      int32_t deepest = 0;
      for (int64_t py = y0; py < y1; ++py) {
        for (int64_t px = x0; px < x1; ++px) {
          const int64_t p = (py - y0) * ts + (px - x0), q = image * plane + py * s.width + px;
          trans[p] = t_end[p] = t_final[q];
          count[p] = last[q];
          deepest = std::max(deepest, last[q]);
          for (int c = 0; c < 4; ++c) behind[4 * p + c] = 0.0;
          const T* go = grad_out + image * 5 * plane + py * s.width + px;
          for (int c = 0; c < 5; ++c) grad[5 * p + c] = go[c * plane];
        }
      }
      const int64_t base = image * s.num;
      for (int64_t k = start + deepest - 1; k >= start; --k) {
        const int64_t slot = base + bins.ids[k];
        const Splat<T> g = load_splat(s, slot);
        const double a = s.conics[3 * slot], b = s.conics[3 * slot + 1], c = s.conics[3 * slot + 2];
        const T* color_t = s.colors + 3 * slot;
        const double color[3] = {color_t[0], color_t[1], color_t[2]};
        const double depth = s.depths[slot];
        const Box box = pixel_box(s, slot, x0, x1, y0, y1);
        const int32_t position = static_cast<int32_t>(k - start);
        double v_mean[2] = {0, 0}, v_conic[3] = {0, 0, 0}, v_color[3] = {0, 0, 0};
        double v_opacity = 0, v_depth = 0;
        for (int64_t py = box.y0; py < box.y1; ++py) {
          const T dy = g.y - (static_cast<T>(py) + T(0.5));
          for (int64_t px = box.x0; px < box.x1; ++px) {
            const int64_t p = (py - y0) * ts + (px - x0);
            if (position >= count[p]) continue;  // at or past this pixel's stop
            const T dx = g.x - (static_cast<T>(px) + T(0.5));
            const T ns = neg_sigma(g, dx, dy);
            if (ns > T(0)) continue;
            const T vis = std::exp(std::max(ns, floor));
            const T raw = g.opacity * vis;
            const T alpha_t = std::min(raw, max_alpha);
            if (alpha_t < alpha_threshold) continue;
            const double alpha = alpha_t;
            const double ra = 1.0 / (1.0 - alpha);
            const double t_before = trans[p] * ra;
            const double weight = alpha * t_before;
            const double* go = grad.data() + 5 * p;
            double* bh = behind.data() + 4 * p;
            double v_alpha = 0.0;
            for (int ch = 0; ch < 3; ++ch) {
              v_color[ch] += weight * go[ch];
              v_alpha += (color[ch] * t_before - bh[ch] * ra) * go[ch];
              bh[ch] += color[ch] * weight;
            }
            v_depth += weight * go[3];
            v_alpha += (depth * t_before - bh[3] * ra) * go[3];
            bh[3] += depth * weight;
            v_alpha += t_end[p] * ra * go[4];
            trans[p] = t_before;
            if (raw < max_alpha) {  // clamped alphas pass no gradient (torch's clamp_max)
              const double ddx = dx, ddy = dy;
              const double v_sigma = -static_cast<double>(raw) * v_alpha;
              v_conic[0] += 0.5 * v_sigma * ddx * ddx;
              v_conic[1] += v_sigma * ddx * ddy;
              v_conic[2] += 0.5 * v_sigma * ddy * ddy;
              v_mean[0] += v_sigma * (a * ddx + b * ddy);
              v_mean[1] += v_sigma * (b * ddx + c * ddy);
              v_opacity += static_cast<double>(vis) * v_alpha;
            }
          }
        }
        double* e = entry.data() + k * kGrads;
        e[0] = v_mean[0];
        e[1] = v_mean[1];
        e[2] = v_conic[0];
        e[3] = v_conic[1];
        e[4] = v_conic[2];
        e[5] = v_color[0];
        e[6] = v_color[1];
        e[7] = v_color[2];
        e[8] = v_opacity;
        e[9] = v_depth;
      }
    }

    // Sum the entries of each slot, image by image (each image's slots are its own).
#pragma omp for schedule(dynamic, 1)
    for (int64_t image = 0; image < s.images; ++image) {
      double* out = grads + image * s.num * kGrads;
      for (int64_t k = bins.offsets[image * tiles]; k < bins.offsets[(image + 1) * tiles]; ++k) {
        double* g = out + static_cast<int64_t>(bins.ids[k]) * kGrads;
        const double* e = entry.data() + k * kGrads;
        for (int j = 0; j < kGrads; ++j) g[j] += e[j];
      }
    }
  }
}

#define SPLATZOO_INSTANTIATE(T)                                                                 \
  template Bins bin_tiles<T>(const Splats<T>&, int);                                            \
  template void rasterize_forward<T>(const Splats<T>&, const BinsView&, T*, T*, int32_t*, int);     \
  template void rasterize_backward<T>(const Splats<T>&, const BinsView&, const T*, const int32_t*, \
                                      const T*, double*, int);
SPLATZOO_INSTANTIATE(float)
SPLATZOO_INSTANTIATE(double)
#undef SPLATZOO_INSTANTIATE

}  // namespace splatzoo
