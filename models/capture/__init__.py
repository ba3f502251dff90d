"""A user's capture (a folder of photos or a video) on its way to a reconstruction: the views and
their poses for a model (:mod:`models.capture.inputs`). Application layer: it stands above
:mod:`models.inference` and the data readers of :mod:`datamodules`."""
