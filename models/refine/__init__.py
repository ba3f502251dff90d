"""``python -m models.refine [GAUSSIANS.ply] PHOTOS output=DIR [key=value ...]``: the
per-scene refinement's command (:mod:`.cli`, run by ``__main__``). The refinement itself is
:mod:`models.pipeline.refine`."""
