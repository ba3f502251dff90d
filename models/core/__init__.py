"""The core: the types every layer shares (``Gaussians`` and transform_gaussians,
``SplatModel`` / ``ModelOutput``, spherical harmonics) and the utilities the data package may use
too (8-bit pixels, atomic output folders, time/memory estimates, the commands' arguments and
their stop on a signal). Imports only ``models.geometry``, ``models.splat_formats`` and
``datamodules.errors``."""
