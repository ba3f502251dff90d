// CPU projection of 3D Gaussians and their SH colours (splatzoo), with the backward pass.
//
// One pass per Gaussian over the images of its scene: EWA projection with gsplat's culling,
// 0.3 px dilation, bounding boxes and antialiasing compensation, and the view-dependent colour
// max(SH(d) + 0.5, 0), the numerics of models/render/projection.py and models/core/sh.py (the
// PyTorch reference the tests compare against). Plain C++ (no torch headers), as
// rasterize_cpu.h; the binding is project_cpu_ops.cpp.
#pragma once

#include <cstdint>

namespace splatzoo {

template <typename T>
struct Scene {
  const T* means;      // [B, N, 3] world centres
  const T* scales;     // [B, N, 3] standard deviations
  const T* rotations;  // [B, N, 4] wxyz quaternions (normalised here)
  const T* opacities;  // [B, N]
  const T* harmonics;  // [B, N, 3, K] SH coefficients, channel-major
  const bool* valid;   // [B, N] slots that may render
  const T* view;       // [B, V, 4, 4] world-to-camera
  const T* centres;    // [B, V, 3] camera centres in the world
  const T* intrinsics; // [B, V, 3, 3] in pixels
  const T* near;       // [B, V]
  const T* far;        // [B, V]
  int64_t batch, views, num, bases, height, width;
  T eps2d;
  bool antialiased;
};

// Per image (b * V + v) and slot: means2d [I, N, 2], conics [I, N, 3], colors [I, N, 3],
// opacities [I, N] (compensated when antialiased), depths [I, N], radii [I, N, 2] (0 when
// culled).
template <typename T>
struct Projected {
  T* means2d;
  T* conics;
  T* colors;
  T* opacities;
  T* depths;
  int32_t* radii;
};

template <typename T>
void project_forward(const Scene<T>& s, const Projected<T>& out, int threads);

// Gradients of the outputs (same layouts as Projected, without radii) to the scene's means
// [B, N, 3], scales [B, N, 3], rotations [B, N, 4], opacities [B, N] and harmonics [B, N, 3, K]
// (summed over the views), and optionally to the cameras' view matrices and centres (summed over
// the Gaussians in a fixed order), all overwritten.
template <typename T>
struct ProjectedGrads {
  const T* means2d;
  const T* conics;
  const T* colors;
  const T* opacities;
  const T* depths;
};

template <typename T>
struct SceneGrads {
  T* means;
  T* scales;
  T* rotations;
  T* opacities;
  T* harmonics;
  T* view;     // [B, V, 4, 4] (row 3 zero), or null: no camera gradients
  T* centres;  // [B, V, 3], or null
};

template <typename T>
void project_backward(const Scene<T>& s, const ProjectedGrads<T>& grads, const SceneGrads<T>& out,
                      int threads);

}  // namespace splatzoo
