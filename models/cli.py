"""Old import path of ``models.training.cli`` (kept as an alias for one release)."""

# relayout: alias
from models._compat import alias_module

alias_module(__name__, "models.training.cli")
