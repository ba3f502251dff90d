"""Geometry: cameras (conventions, projection, scene normalisation), rotations and quaternions,
similarities and their fits (Umeyama). The lowest layer: imports nothing of the project."""
