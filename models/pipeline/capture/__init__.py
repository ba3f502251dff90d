"""A user's capture (a folder of photos or a video) on its way to a reconstruction: the views and
their poses for a model (:mod:`models.pipeline.capture.inputs`), which photos go together into a forward
pass (:mod:`models.pipeline.capture.views`), the whole capture in overlapping windows fused into one set
(:mod:`models.pipeline.capture.whole`, :mod:`models.pipeline.capture.fusion`) and held-out photos scored
(:mod:`models.pipeline.capture.holdout`). Application layer: it stands above :mod:`models.pipeline.inference` and
the data readers of :mod:`datamodules`."""
