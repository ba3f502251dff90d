"""Old import path of ``datamodules.tools.synthetic`` (kept as an alias for one release)."""

# relayout: alias
if __name__ == "__main__":  # python -m datamodules.synthetic ...: run the new module's command
    import runpy

    runpy.run_module("datamodules.tools.synthetic", run_name="__main__", alter_sys=True)
else:
    from models._compat import alias_module

    alias_module(__name__, "datamodules.tools.synthetic")
