"""Weights, in timm's order (each module imports only those before it): ``pretrained_cfg``
(what is known about a set of weights, ``architecture.tag``) → ``models.weights.registry`` → ``hub``
(locations, downloads, the sha256 check, reading and writing files; ``publish``: model cards
and the upload to the Hub) → ``builder``
(build from recorded arguments, the family's ``checkpoint_filter_fn``, strict loading) →
``models.weights.factory`` (``create_model``, ``load_model``); ``convert`` turns a release file into this
project's folder (``python -m models.weights.convert``)."""
