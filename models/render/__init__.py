"""The renderer: ``render`` (its input checks and backend dispatch, ``core``) over the projection,
the torch tiled rasteriser, the gsplat backend and the compiled CPU rasteriser (``cpu`` +
``csrc/``). The package exports ``core``'s public names."""

from models.render.core import *  # noqa: F403
from models.render.core import __all__  # noqa: F401
