"""Old import path of ``datamodules.training.chunk_dataset`` (kept as an alias for one release)."""

# relayout: alias
from models._compat import alias_module

alias_module(__name__, "datamodules.training.chunk_dataset")
