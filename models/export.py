"""Old import path of ``models.training.export`` (kept as an alias for one release)."""

# relayout: alias
if __name__ == "__main__":  # python -m models.export ...: run the new module's command
    import runpy

    runpy.run_module("models.training.export", run_name="__main__", alter_sys=True)
else:
    from models._compat import alias_module

    alias_module(__name__, "models.training.export")
