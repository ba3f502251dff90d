"""The one registry and the weights line, in timm's order (each module imports only those before
it): ``pretrained_cfg`` (what is known about a set of weights, ``architecture.tag``; the
``input_recipe`` it holds) → ``registry`` (``@register_model`` entry points, ``list_models``,
``get_pretrained_cfg``; ``knobs``, the inference knobs families declare) → ``hub`` (locations,
downloads, the sha256 check, reading and writing files; ``publish``: model cards and the upload
to the Hub) → ``builder`` (build from recorded arguments, the family's ``checkpoint_filter_fn``,
strict loading) → ``factory`` (``create_model``, ``load_model``); ``convert`` turns a release file
into this project's folder (``python -m models.weights.convert``). Below the families, which
register themselves here, as timm's model files do with its ``_registry`` and ``_builder``."""
