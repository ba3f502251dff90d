"""The application layer: inference as a library (:mod:`.inference`), a user's capture
(:mod:`.capture`), the per-scene refinement (:mod:`.refine`), the test-time pose fit
(:mod:`.pose_fit`), image metrics (:mod:`.metrics`), the commands' typed settings
(:mod:`.settings`), the refinement's checks (:mod:`.refinement`) and ``infer.py``'s stages
(:mod:`.run`). Above the families and the weights line; below the commands' folders."""
