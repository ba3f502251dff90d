// CPU tile rasteriser of projected 2D Gaussians (splatzoo), gsplat 1.5's numerics.
//
// Plain C++ (no torch headers) so this translation unit compiles in seconds; the torch binding is
// rasterize_cpu_ops.cpp. Layouts are dense per image: I images, N Gaussian slots each.
#pragma once

#include <cstdint>
#include <vector>

namespace splatzoo {

template <typename T>
struct Splats {
  const T* means2d;    // [I, N, 2] pixel centres
  const T* conics;     // [I, N, 3] (a, b, c) of the inverse 2D covariance
  const T* colors;     // [I, N, 3]
  const T* opacities;  // [I, N]
  const T* depths;     // [I, N] camera z
  const int32_t* radii;  // [I, N, 2] bounding-box half-sizes, 0 where culled
  int64_t images, num, height, width, tile;
};

// Per-tile depth-sorted lists of Gaussian slots: tile t of image i (flat id i * tiles + t) holds
// ids[offsets[id] .. offsets[id + 1]).
struct Bins {
  std::vector<int64_t> offsets;  // [I * tiles + 1]
  std::vector<int32_t> ids;      // [M] slot indices within the image
};

struct BinsView {
  const int64_t* offsets;
  const int32_t* ids;
  int64_t total;
};

template <typename T>
Bins bin_tiles(const Splats<T>& s, int threads);

// out [I, 5, H, W] (r, g, b, depth, alpha, no background), t_final [I, H, W] remaining
// transmittance, last [I, H, W] number of list entries each pixel went through (the entry that
// stopped it excluded).
template <typename T>
void rasterize_forward(const Splats<T>& s, const BinsView& bins, T* out, T* t_final, int32_t* last,
                       int threads);

// grad_out [I, 5, H, W]; grads [I, N, 10] (zeroed by the caller): d means2d (2), d conics (3),
// d colors (3), d opacities, d depths.
template <typename T>
void rasterize_backward(const Splats<T>& s, const BinsView& bins, const T* t_final,
                        const int32_t* last, const T* grad_out, double* grads, int threads);

}  // namespace splatzoo
