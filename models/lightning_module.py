"""Old import path of the LightningModule, kept for one release: it is
``models.training.module`` now (``models.training.SplatLitModule``)."""

from .training.module import *  # noqa: F403
from .training.module import (  # noqa: F401  (public here too, for older imports)
    VGG16_WEIGHTS,
    __all__,  # noqa: F401
    build_lpips,
    lpips_inputs,
    mean_color_baseline,
    nearest_view_baseline,
    net_identity,
    psnr_per_image,
    ssim_per_image,
)
