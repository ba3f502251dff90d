"""The application layer: typed settings (:mod:`.settings`), the refinement's checks
(:mod:`.refinement`) and ``infer.py``'s stages (:mod:`.run`)."""
