"""The renderer: ``render`` (its input checks and backend dispatch, ``core``) over the projection,
the torch tiled rasteriser, the gsplat backend and the compiled CPU rasteriser (``cpu`` +
``csrc/``)."""

# relayout: facade (the public names of models.render.core)
from models.render.core import (
    ALPHA_THRESHOLD,
    BACKENDS,
    EPS2D,
    MAX_ALPHA,
    RASTERIZE_MODES,
    TILE_SIZE,
    TRANSMITTANCE_MIN,
    Projection,
    RenderOutput,
    gsplat_available,
    opacity_compensation,
    project_gaussians,
    render,
)

__all__ = [
    "ALPHA_THRESHOLD",
    "BACKENDS",
    "EPS2D",
    "MAX_ALPHA",
    "RASTERIZE_MODES",
    "TILE_SIZE",
    "TRANSMITTANCE_MIN",
    "Projection",
    "RenderOutput",
    "gsplat_available",
    "opacity_compensation",
    "project_gaussians",
    "render",
]
