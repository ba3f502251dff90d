// CPU tile rasteriser: binning, front-to-back forward, back-to-front backward (gsplat's scheme).
//
// The arithmetic of one (pixel, Gaussian) evaluation follows the torch backend of
// models/render.py operation by operation (built with -ffp-contract=off, so no fused
// multiply-adds); only exp differs (Cephes' here, Sleef's in torch, both about 1 ulp), so both
// make the same skip and stop decisions except within rounding of a threshold:
//   d = mean - pixel centre,  -sigma = ((-c/2) dy) dy + ((-a/2) dx) dx + dy ((-b) dx),
//   alpha = min(o exp(max(-sigma, -20)), 0.999),  skipped when sigma < 0 or alpha < 1/255,
//   a pixel stops at the first Gaussian that takes its transmittance to 1e-4 or below (that
//   Gaussian not composited).
#include "rasterize_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace splatzoo {
namespace {

constexpr double kAlphaThreshold = 1.0 / 255.0;
constexpr double kMaxAlpha = 0.999;
constexpr double kTransmittanceMin = 1e-4;

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

// Where a Gaussian can reach alpha >= 1/255 inside a tile: rows of its bounding box (radii)
// and, per row, the span of the ellipse sigma <= ln(255 o) (solved in double with a margin, then
// widened by a pixel), so pixels outside it are never evaluated. Within the span, -sigma below
// `skip` (the same level with a margin) means alpha < 1/255 whatever exp rounds to, so exp is
// only evaluated near and inside the ellipse. Both shortcuts drop only pixels the exact test
// would skip.
template <typename T>
struct Footprint {
  bool empty;
  int64_t y0, y1;       // rows [y0, y1) in the tile
  double x, y, a, b, c;  // mean (pixels) and conic in double
  double level;         // 2 * (ln(255 o) + margin)
  double inv_a, cross, base;  // 1 / a, b^2 - a c, a * level
  int64_t box_x0, box_x1;
  T skip;               // -sigma below this: alpha < 1/255

  // Columns [lo[i], hi[i]) worth evaluating of rows py0 + i, i < rows (empty: hi = lo), as
  // whole numbers. The loop has no branch (the rows one at a time, each tested, were about 3%
  // slower a render pass).
  inline void spans(int64_t py0, int64_t rows, double* lo, double* hi) const {
    const double left = double(box_x0), right = double(box_x1);
    for (int64_t i = 0; i < rows; ++i) {
      const double dy = y - (double(py0 + i) + 0.5);
      const double disc = cross * dy * dy + base;
      const double root = std::sqrt(std::max(disc, 0.0));
      // pixel centre u = x - dx with a dx^2 + 2 b dy dx + c dy^2 <= level
      const double u_lo = x - (-b * dy + root) * inv_a, u_hi = x - (-b * dy - root) * inv_a;
      const double x0 = std::min(std::max(std::floor(u_lo - 0.5) - 1.0, left), right);
      const double x1 = std::min(std::max(std::ceil(u_hi - 0.5) + 2.0, left), right);
      lo[i] = x0;
      hi[i] = disc >= 0.0 ? std::max(x0, x1) : x0;  // no row of the ellipse here: empty
    }
  }
};

template <typename T>
inline Footprint<T> footprint(const Splats<T>& s, int64_t slot, int64_t tx0, int64_t tx1,
                              int64_t ty0, int64_t ty1) {
  Footprint<T> f;
  f.x = s.means2d[2 * slot];
  f.y = s.means2d[2 * slot + 1];
  f.a = s.conics[3 * slot];
  f.b = s.conics[3 * slot + 1];
  f.c = s.conics[3 * slot + 2];
  const double opacity = s.opacities[slot];
  const double rx = s.radii[2 * slot], ry = s.radii[2 * slot + 1];
  auto lo = [](double v, int64_t a, int64_t b) {
    return static_cast<int64_t>(std::clamp(std::floor(v) - 1.0, double(a), double(b)));
  };
  auto hi = [](double v, int64_t a, int64_t b) {
    return static_cast<int64_t>(std::clamp(std::ceil(v) + 2.0, double(a), double(b)));
  };
  f.box_x0 = lo(f.x - rx, tx0, tx1);
  f.box_x1 = hi(f.x + rx, tx0, tx1);
  f.y0 = lo(f.y - ry, ty0, ty1);
  f.y1 = hi(f.y + ry, ty0, ty1);
  // alpha <= o when sigma >= 0, so o < 1/255 never composites.
  f.empty = !(opacity >= kAlphaThreshold) || f.box_x0 >= f.box_x1 || f.y0 >= f.y1;
  const double reach = std::log(opacity / kAlphaThreshold);  // ln(255 o) >= 0
  const double margin = 1e-3 * (1.0 + std::abs(reach));
  f.level = 2.0 * (reach + margin);
  f.skip = static_cast<T>(-(reach + margin));
  if (!(f.a > 0.0) || !std::isfinite(f.level) || !std::isfinite(f.b) || !std::isfinite(f.c)) {
    // Not a positive-definite conic: evaluate the whole box (the per-pixel test decides).
    f.a = 1.0;
    f.b = 0.0;
    f.c = 0.0;
    f.level = std::numeric_limits<double>::infinity();
    f.skip = -std::numeric_limits<T>::infinity();
  }
  f.inv_a = 1.0 / f.a;
  f.cross = f.b * f.b - f.a * f.c;
  f.base = f.a * f.level;
  return f;
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

// A tile's list visits slots in depth order, scattered over the arrays: fetching a slot's fields
// a few entries ahead overlaps those cache misses with the evaluations in between.
constexpr int64_t kLookahead = 4;

// One lane chunk of a Gaussian's footprint in a tile: its first pixel (tile array index), first
// column, the span's columns [lo, hi) and the row's dy, all tile-local.
template <typename T>
struct ChunkItem {
  int32_t p;
  T column, lo, hi, dy;
};

// A Gaussian's lane chunks in a tile that its span rows meet (rows where `row_alive` is 0
// skipped; nullptr: none), row-major into `items`; their number. Appended without a branch on
// the span, so the loop that evaluates them has no branch that waits on an evaluation and
// consecutive chunks overlap (the loops over rows, then chunks, mispredicted at every exit).
template <typename T, int W>
inline int64_t chunk_items(const Footprint<T>& f, T mean_y, int64_t x0, int64_t y0, int64_t stride,
                           int64_t chunks, const int32_t* row_alive, double* lo, double* hi,
                           ChunkItem<T>* items) {
  const int64_t rows = f.y1 - f.y0;
  f.spans(f.y0, rows, lo, hi);
  int64_t n = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t py = f.y0 + i;
    const int64_t px0 = static_cast<int64_t>(lo[i]), px1 = static_cast<int64_t>(hi[i]);
    const bool live = row_alive == nullptr || row_alive[py - y0] != 0;
    const T dy = mean_y - (static_cast<T>(py) + T(0.5));
    const int64_t row = (py - y0) * stride;
    for (int64_t c = 0; c < chunks; ++c) {
      items[n] = {static_cast<int32_t>(row + c * W), static_cast<T>(c * W),
                  static_cast<T>(px0 - x0), static_cast<T>(px1 - x0), dy};
      n += live & (px0 - x0 < (c + 1) * W) & (px1 - x0 > c * W);
    }
  }
  return n;
}
template <typename T>
inline void prefetch_slot(const Splats<T>& s, int64_t slot) {
  __builtin_prefetch(s.means2d + 2 * slot);
  __builtin_prefetch(s.conics + 3 * slot);
  __builtin_prefetch(s.opacities + slot);
  __builtin_prefetch(s.radii + 2 * slot);
  __builtin_prefetch(s.colors + 3 * slot);
  __builtin_prefetch(s.depths + slot);
}

// ------------------------------------------------------------------------------- SIMD lanes
// GCC vector extensions: 8 float or 4 double lanes over a tile row (the compiler splits them into
// SSE2 halves on baseline x86-64). Masks are integer vectors of all-ones / zeros.
template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  static constexpr int W = 8;
  typedef float V __attribute__((vector_size(32)));
  typedef int32_t M __attribute__((vector_size(32)));
  using I = int32_t;
};
template <>
struct Lanes<double> {
  static constexpr int W = 4;
  typedef double V __attribute__((vector_size(32)));
  typedef int64_t M __attribute__((vector_size(32)));
  using I = int64_t;
};

template <class V, class T>
inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
inline void store(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}
template <class M>
inline bool any(const M& m) {
  uint64_t words[sizeof(M) / 8];
  std::memcpy(words, &m, sizeof(M));
  uint64_t r = 0;
  for (uint64_t w : words) r |= w;
  return r != 0;
}
template <class V>
inline double hsum(const V& v) {
  constexpr int n = sizeof(V) / sizeof(v[0]);
  double r = 0.0;
  for (int i = 0; i < n; ++i) r += static_cast<double>(v[i]);
  return r;
}

// exp on [-20, 0] (inputs are clamped to it), Cephes' algorithms (about 1 ulp): x = n ln2 + r,
// a polynomial (float) or a Pade form (double) in r, times 2^n built from the exponent bits.
inline Lanes<float>::V exp_lanes(Lanes<float>::V x) {
  using V = Lanes<float>::V;
  using M = Lanes<float>::M;
  x = x < -20.0f ? V{} - 20.0f : x;
  x = x > 0.0f ? V{} : x;
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: (t + magic) - magic rounds t to an integer
  const V n = ((x * 1.44269504088896341f) + magic) - magic;
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const V z = r * r;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * z + r + 1.0f;
  const M bits = (__builtin_convertvector(n, M) + 127) << 23;
  return y * (V)bits;
}

inline Lanes<double>::V exp_lanes(Lanes<double>::V x) {
  using V = Lanes<double>::V;
  using M = Lanes<double>::M;
  x = x < -20.0 ? V{} - 20.0 : x;
  x = x > 0.0 ? V{} : x;
  const V magic = V{} + 6755399441055744.0;  // 1.5 * 2^52
  const V n = ((x * 1.4426950408889634073599) + magic) - magic;
  V r = x - n * 6.93145751953125e-1;
  r = r - n * 1.42860682030941723212e-6;
  const V xx = r * r;
  V p = V{} + 1.26177193074810590878e-4;
  p = p * xx + 3.02994407707441961300e-2;
  p = p * xx + 9.99999999999999999910e-1;
  p = p * r;
  V q = V{} + 3.00198505138664455042e-6;
  q = q * xx + 2.52448340349684104192e-3;
  q = q * xx + 2.27265548208155028766e-1;
  q = q * xx + 2.00000000000000000009e0;
  const V y = (p / (q - p)) * 2.0 + 1.0;
  const M bits = (__builtin_convertvector(n, M) + 1023) << 52;
  return y * (V)bits;
}

// Tiles of one image (flat ids 0 .. tiles) whose pixel centres a Gaussian can reach with
// alpha >= 1/255: gsplat's tile range of the bounding box (float32 arithmetic as its kernel),
// minus tiles where alpha < 1/255 at every pixel centre. Appended in row-major tile order.
template <typename T>
void tiles_of(const Splats<T>& s, int64_t slot, int64_t tiles_x, int64_t tiles_y,
              std::vector<int32_t>& out) {
  const float tile_f = static_cast<float>(s.tile);
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
  if (x_lo >= x_hi || y_lo >= y_hi) return;
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
        out.push_back(static_cast<int32_t>(ty * tiles_x + tx));
      }
    }
  }
}

// Unsigned integers in the order of the floats (-0 as +0; depths of visible slots are finite).
inline uint32_t order_bits(float v) {
  uint32_t u;
  v = v == 0.0f ? 0.0f : v;
  std::memcpy(&u, &v, sizeof(u));
  return (u >> 31) ? ~u : u | (uint32_t(1) << 31);
}
inline uint64_t order_bits(double v) {
  uint64_t u;
  v = v == 0.0 ? 0.0 : v;
  std::memcpy(&u, &v, sizeof(u));
  return (u >> 63) ? ~u : u | (uint64_t(1) << 63);
}

// Stable LSD radix sort of (key, slot) pairs by key, 8 bits a pass.
template <typename U>
void radix_sort(std::vector<std::pair<U, int32_t>>& items) {
  std::vector<std::pair<U, int32_t>> buffer(items.size());
  for (unsigned shift = 0; shift < 8 * sizeof(U); shift += 8) {
    size_t count[257] = {0};
    for (const auto& item : items) ++count[((item.first >> shift) & 255) + 1];
    if (*std::max_element(count, count + 257) == items.size()) continue;  // one digit: no-op
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (const auto& item : items) buffer[count[(item.first >> shift) & 255]++] = item;
    items.swap(buffer);
  }
}

// One image's tile lists on `threads` threads: ids in the order of flat tile ids, each tile's
// Gaussians in depth order with ties by slot index (the torch backend's stable sort); counts
// [tiles + 1] are the lists' offsets. The result does not depend on `threads`.
template <typename T>
void bin_image(const Splats<T>& s, int64_t image, int threads, std::vector<int32_t>& ids,
               std::vector<int64_t>& counts) {
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y, base = image * s.num;
  // Each slot's tiles, by chunks of slots (hits[chunk], the slot's first at first[n]), and the
  // (depth, slot) keys of the slots with a tile. Chunk-local vectors until the chunk is done.
  using Key = std::pair<decltype(order_bits(T())), int32_t>;
  constexpr int64_t kChunk = 2048;
  const int64_t chunks = ceil_div(s.num, kChunk);
  std::vector<std::vector<int32_t>> hits(chunks);
  std::vector<std::vector<Key>> keys(chunks);
  std::vector<int32_t> first(s.num), number(s.num);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    std::vector<int32_t> out;
    std::vector<Key> own;
    for (int64_t n = chunk * kChunk; n < std::min((chunk + 1) * kChunk, s.num); ++n) {
      first[n] = static_cast<int32_t>(out.size());
      const int32_t* r = s.radii + 2 * (base + n);
      if (r[0] > 0 || r[1] > 0) tiles_of(s, base + n, tiles_x, tiles_y, out);
      number[n] = static_cast<int32_t>(out.size()) - first[n];
      if (number[n] > 0) own.emplace_back(order_bits(s.depths[base + n]), static_cast<int32_t>(n));
    }
    hits[chunk] = std::move(out);
    keys[chunk] = std::move(own);
  }
  // Those slots in depth order, ties by slot index (the keys are in slot order, the sort stable).
  std::vector<Key> order;
  for (const auto& own : keys) order.insert(order.end(), own.begin(), own.end());
  radix_sort(order);
  // Counting sort of the (tile, slot) pairs by tile, stable, so each tile's list stays in depth
  // order: parts of `order` count their pairs per tile, then write from their own cursors.
  const int64_t visible = static_cast<int64_t>(order.size());
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, visible / 4096));
  std::vector<int64_t> cursor(parts * tiles, 0);
  auto for_pairs = [&](int64_t part, auto&& visit) {
    for (int64_t i = visible * part / parts; i < visible * (part + 1) / parts; ++i) {
      const int32_t n = order[i].second;
      const int32_t* t = hits[n / kChunk].data() + first[n];
      for (int32_t j = 0; j < number[n]; ++j) visit(t[j], n);
    }
  };
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    int64_t* own = cursor.data() + part * tiles;
    for_pairs(part, [own](int32_t t, int32_t) { ++own[t]; });
  }
  counts.assign(tiles + 1, 0);
  int64_t total = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    counts[t] = total;
    for (int64_t part = 0; part < parts; ++part) {
      const int64_t c = cursor[part * tiles + t];
      cursor[part * tiles + t] = total;
      total += c;
    }
  }
  counts[tiles] = total;
  ids.resize(total);
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (int64_t part = 0; part < parts; ++part) {
    int64_t* own = cursor.data() + part * tiles;
    int32_t* out = ids.data();
    for_pairs(part, [own, out](int32_t t, int32_t n) { out[own[t]++] = n; });
  }
}

}  // namespace

template <typename T>
Bins bin_tiles(const Splats<T>& s, int threads) {
  const int64_t tiles = ceil_div(s.width, s.tile) * ceil_div(s.height, s.tile);
  std::vector<std::vector<int32_t>> per_image_ids(s.images);
  std::vector<std::vector<int64_t>> per_image_counts(s.images);
  // Threads over images when there are enough of them, else within each image.
  const bool across = s.images >= threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(across ? threads : 1)
  for (int64_t image = 0; image < s.images; ++image) {
    bin_image(s, image, across ? 1 : threads, per_image_ids[image], per_image_counts[image]);
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
  using V = typename Lanes<T>::V;
  using M = typename Lanes<T>::M;
  using I = typename Lanes<T>::I;
  constexpr int W = Lanes<T>::W;
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y, plane = s.height * s.width, ts = s.tile;
  const int64_t chunks = ceil_div(ts, W), stride = chunks * W;  // row stride of tile arrays
  const T alpha_threshold = static_cast<T>(kAlphaThreshold);
  const T max_alpha = static_cast<T>(kMaxAlpha);
  const T t_min = static_cast<T>(kTransmittanceMin);
  V lane_offsets;
  for (int i = 0; i < W; ++i) lane_offsets[i] = static_cast<T>(i);

#pragma omp parallel num_threads(threads)
  {
    // Per tile pixel (row-major, `stride` per row): transmittance, accumulated r, g, b, depth,
    // a live mask (all ones until the pixel stops) and the list position it stopped at.
    std::vector<T> trans(ts * stride), acc_r(ts * stride), acc_g(ts * stride), acc_b(ts * stride),
        acc_z(ts * stride);
    std::vector<I> live(ts * stride);
    std::vector<int32_t> stop(ts * stride), row_alive(ts);
    std::vector<ChunkItem<T>> items(ts * chunks);
    std::vector<double> span_lo(ts), span_hi(ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t flat = 0; flat < s.images * tiles; ++flat) {
      const int64_t image = flat / tiles, tile = flat % tiles;
      const int64_t x0 = (tile % tiles_x) * ts, y0 = (tile / tiles_x) * ts;
      const int64_t x1 = std::min(x0 + ts, s.width), y1 = std::min(y0 + ts, s.height);
      const int64_t start = bins.offsets[flat], end = bins.offsets[flat + 1];
      const int32_t length = static_cast<int32_t>(end - start);
      std::fill(trans.begin(), trans.end(), T(1));
      for (auto* a : {&acc_r, &acc_g, &acc_b, &acc_z}) std::fill(a->begin(), a->end(), T(0));
      std::fill(stop.begin(), stop.end(), length);
      for (int64_t ly = 0; ly < ts; ++ly) {
        for (int64_t lx = 0; lx < stride; ++lx) {
          live[ly * stride + lx] = (y0 + ly < y1 && x0 + lx < x1) ? I(-1) : I(0);
        }
      }
      int64_t alive = (x1 - x0) * (y1 - y0);
      std::fill(row_alive.begin(), row_alive.end(), static_cast<int32_t>(x1 - x0));
      const int64_t base = image * s.num;
      for (int64_t k = start; k < end && alive > 0; ++k) {
        const int64_t slot = base + bins.ids[k];
        if (k + kLookahead < end) prefetch_slot(s, base + bins.ids[k + kLookahead]);
        const Footprint<T> f = footprint(s, slot, x0, x1, y0, y1);
        if (f.empty) continue;
        const Splat<T> g = load_splat(s, slot);
        const T* color = s.colors + 3 * slot;
        const T depth = s.depths[slot];
        const int32_t position = static_cast<int32_t>(k - start);
        const int64_t n = chunk_items<T, W>(f, g.y, x0, y0, stride, chunks, row_alive.data(),
                                            span_lo.data(), span_hi.data(), items.data());
        for (int64_t i = 0; i < n; ++i) {
          const ChunkItem<T> item = items[i];
          const int64_t p = item.p;
          const V lx = lane_offsets + item.column;  // tile-local columns
          const T dy = item.dy;
          const T quad_y = g.neg_half_c * dy * dy;
          M mask = load<M>(live.data() + p) & (lx >= item.lo) & (lx < item.hi);
          const V dx = g.x - ((lx + static_cast<T>(x0)) + T(0.5));
          const V quad_x = g.neg_half_a * dx * dx;
          const V cross_x = g.neg_b * dx;
          const V ns = (quad_y + quad_x) + dy * cross_x;
          mask &= (ns <= T(0)) & (ns >= f.skip);
          V alpha = g.opacity * exp_lanes(ns);
          alpha = alpha < max_alpha ? alpha : V{} + max_alpha;
          mask &= alpha >= alpha_threshold;
          const V t = load<V>(trans.data() + p);
          const V next = t * (T(1) - alpha);
          const M stops = mask & (next <= t_min);
          if (__builtin_expect(any(stops), 0)) {
            for (int j = 0; j < W; ++j) {
              if (stops[j]) {
                stop[p + j] = position;
                live[p + j] = 0;
                --alive;
                --row_alive[p / stride];
              }
            }
            mask &= ~stops;
          }
          const V weight = alpha * t;
          const V r = load<V>(acc_r.data() + p), gg = load<V>(acc_g.data() + p);
          const V b = load<V>(acc_b.data() + p), z = load<V>(acc_z.data() + p);
          store(acc_r.data() + p, mask ? r + weight * color[0] : r);
          store(acc_g.data() + p, mask ? gg + weight * color[1] : gg);
          store(acc_b.data() + p, mask ? b + weight * color[2] : b);
          store(acc_z.data() + p, mask ? z + weight * depth : z);
          store(trans.data() + p, mask ? next : t);
        }
      }
      T* image_out = out + image * 5 * plane;
      for (int64_t py = y0; py < y1; ++py) {
        for (int64_t px = x0; px < x1; ++px) {
          const int64_t p = (py - y0) * stride + (px - x0), q = py * s.width + px;
          image_out[q] = acc_r[p];
          image_out[plane + q] = acc_g[p];
          image_out[2 * plane + q] = acc_b[p];
          image_out[3 * plane + q] = acc_z[p];
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
  using V = typename Lanes<T>::V;
  using M = typename Lanes<T>::M;
  using I = typename Lanes<T>::I;
  constexpr int W = Lanes<T>::W;
  const int64_t tiles_x = ceil_div(s.width, s.tile), tiles_y = ceil_div(s.height, s.tile);
  const int64_t tiles = tiles_x * tiles_y, plane = s.height * s.width, ts = s.tile;
  const int64_t chunks = ceil_div(ts, W), stride = chunks * W;
  const T alpha_threshold = static_cast<T>(kAlphaThreshold);
  const T max_alpha = static_cast<T>(kMaxAlpha);
  const int64_t total = bins.total;
  constexpr int kGrads = 10;
  V lane_offsets;
  for (int i = 0; i < W; ++i) lane_offsets[i] = static_cast<T>(i);
  // Per-intersection gradients: each entry belongs to one tile, so threads never share one and
  // the result does not depend on the schedule. Each tile zeroes its own entries.
  std::unique_ptr<double[]> entry(new double[total * kGrads]);
  // Slots are summed in `parts` ranges per image, each range by one thread.
  const int64_t parts = ceil_div(threads, s.images);

#pragma omp parallel num_threads(threads)
  {
    // Per tile pixel: transmittance after the entries not yet visited (walking back), the colour
    // and depth composited behind them, the output gradients, the final transmittance and the
    // number of entries the forward pass went through (0 outside the image).
    const int64_t size = ts * stride;
    std::vector<T> trans(size), t_end(size), behind_r(size), behind_g(size), behind_b(size),
        behind_z(size), go_r(size), go_g(size), go_b(size), go_z(size), go_a(size);
    std::vector<I> count(size);
    std::vector<ChunkItem<T>> items(ts * chunks);
    std::vector<double> span_lo(ts), span_hi(ts);
#pragma omp for schedule(dynamic, 1)
    for (int64_t flat = 0; flat < s.images * tiles; ++flat) {
      const int64_t start = bins.offsets[flat], end = bins.offsets[flat + 1];
      if (start == end) continue;
      std::fill(entry.get() + start * kGrads, entry.get() + end * kGrads, 0.0);
      const int64_t image = flat / tiles, tile = flat % tiles;
      const int64_t x0 = (tile % tiles_x) * ts, y0 = (tile / tiles_x) * ts;
      const int64_t x1 = std::min(x0 + ts, s.width), y1 = std::min(y0 + ts, s.height);
      for (auto* a : {&trans, &t_end, &behind_r, &behind_g, &behind_b, &behind_z, &go_r, &go_g,
                      &go_b, &go_z, &go_a}) {
        std::fill(a->begin(), a->end(), T(0));
      }
      std::fill(count.begin(), count.end(), I(0));
      int32_t deepest = 0;
      const T* go = grad_out + image * 5 * plane;
      for (int64_t py = y0; py < y1; ++py) {
        for (int64_t px = x0; px < x1; ++px) {
          const int64_t p = (py - y0) * stride + (px - x0), q = py * s.width + px;
          trans[p] = t_end[p] = t_final[image * plane + q];
          count[p] = last[image * plane + q];
          deepest = std::max(deepest, last[image * plane + q]);
          go_r[p] = go[q];
          go_g[p] = go[plane + q];
          go_b[p] = go[2 * plane + q];
          go_z[p] = go[3 * plane + q];
          go_a[p] = go[4 * plane + q];
        }
      }
      const int64_t base = image * s.num;
      for (int64_t k = start + deepest - 1; k >= start; --k) {
        const int64_t slot = base + bins.ids[k];
        if (k - kLookahead >= start) prefetch_slot(s, base + bins.ids[k - kLookahead]);
        const Footprint<T> f = footprint(s, slot, x0, x1, y0, y1);
        if (f.empty) continue;
        const Splat<T> g = load_splat(s, slot);
        const T a = s.conics[3 * slot], b = s.conics[3 * slot + 1], c = s.conics[3 * slot + 2];
        const T* color = s.colors + 3 * slot;
        const T depth = s.depths[slot];
        const I position = static_cast<I>(k - start);
        V v_mx{}, v_my{}, v_ca{}, v_cb{}, v_cc{}, v_r{}, v_g{}, v_b{}, v_o{}, v_z{};
        const int64_t n = chunk_items<T, W>(f, g.y, x0, y0, stride, chunks, nullptr,
                                            span_lo.data(), span_hi.data(), items.data());
        for (int64_t i = 0; i < n; ++i) {
          const ChunkItem<T> item = items[i];
          const int64_t p = item.p;
          const V lx = lane_offsets + item.column;
          const T dy = item.dy;
          const T quad_y = g.neg_half_c * dy * dy;
          // Entries before this pixel's stop only (this also excludes pixels outside).
          M mask = (load<M>(count.data() + p) > position) & (lx >= item.lo) & (lx < item.hi);
          const V dx = g.x - ((lx + static_cast<T>(x0)) + T(0.5));
          const V quad_x = g.neg_half_a * dx * dx;
          const V cross_x = g.neg_b * dx;
          const V ns = (quad_y + quad_x) + dy * cross_x;
          mask &= (ns <= T(0)) & (ns >= f.skip);
          const V vis = exp_lanes(ns);
          const V raw = g.opacity * vis;
          const V alpha = raw < max_alpha ? raw : V{} + max_alpha;
          mask &= alpha >= alpha_threshold;
          const V ra = T(1) / (T(1) - alpha);
          const V t = load<V>(trans.data() + p);
          const V t_before = t * ra;
          const V weight = alpha * t_before;
          const V gr = load<V>(go_r.data() + p), gg = load<V>(go_g.data() + p);
          const V gb = load<V>(go_b.data() + p), gz = load<V>(go_z.data() + p);
          const V ga = load<V>(go_a.data() + p);
          const V br = load<V>(behind_r.data() + p), bg = load<V>(behind_g.data() + p);
          const V bb = load<V>(behind_b.data() + p), bz = load<V>(behind_z.data() + p);
          v_r += mask ? weight * gr : V{};
          v_g += mask ? weight * gg : V{};
          v_b += mask ? weight * gb : V{};
          v_z += mask ? weight * gz : V{};
          // d out / d alpha: this Gaussian's colour times T, minus what is behind it (and the
          // final transmittance, for alpha) over 1 - alpha.
          const V v_alpha = (color[0] * t_before - br * ra) * gr +
                            (color[1] * t_before - bg * ra) * gg +
                            (color[2] * t_before - bb * ra) * gb +
                            (depth * t_before - bz * ra) * gz +
                            load<V>(t_end.data() + p) * ra * ga;
          store(behind_r.data() + p, mask ? br + color[0] * weight : br);
          store(behind_g.data() + p, mask ? bg + color[1] * weight : bg);
          store(behind_b.data() + p, mask ? bb + color[2] * weight : bb);
          store(behind_z.data() + p, mask ? bz + depth * weight : bz);
          store(trans.data() + p, mask ? t_before : t);
          // Clamped alphas pass no gradient (torch's clamp_max).
          const M unclamped = mask & (raw < max_alpha);
          const V v_sigma = unclamped ? -raw * v_alpha : V{};
          v_ca += T(0.5) * v_sigma * dx * dx;
          v_cb += v_sigma * dx * dy;
          v_cc += T(0.5) * v_sigma * dy * dy;
          v_mx += v_sigma * (a * dx + b * dy);
          v_my += v_sigma * (b * dx + c * dy);
          v_o += unclamped ? vis * v_alpha : V{};
        }
        double* e = entry.get() + k * kGrads;
        e[0] = hsum(v_mx);
        e[1] = hsum(v_my);
        e[2] = hsum(v_ca);
        e[3] = hsum(v_cb);
        e[4] = hsum(v_cc);
        e[5] = hsum(v_r);
        e[6] = hsum(v_g);
        e[7] = hsum(v_b);
        e[8] = hsum(v_o);
        e[9] = hsum(v_z);
      }
    }

    // Sum the entries of each slot in list order (each image's slots are its own), a range of
    // slots at a time: every range reads the image's whole list and adds its own slots' entries.
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < s.images * parts; ++job) {
      const int64_t image = job / parts, part = job % parts;
      const int32_t lo = static_cast<int32_t>(s.num * part / parts);
      const int32_t hi = static_cast<int32_t>(s.num * (part + 1) / parts);
      double* out = grads + image * s.num * kGrads;
      for (int64_t k = bins.offsets[image * tiles]; k < bins.offsets[(image + 1) * tiles]; ++k) {
        const int32_t n = bins.ids[k];
        if (n < lo || n >= hi) continue;
        double* g = out + static_cast<int64_t>(n) * kGrads;
        const double* e = entry.get() + k * kGrads;
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
