"""Geometry: cameras (conventions, projection, scene normalisation), rotations and quaternions,
rigid fits. The lowest layer: imports nothing of the project."""
