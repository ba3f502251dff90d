"""Tools: convert and make_index (commands, ``python -m datamodules.tools.<name>``) and sfm
(structure-from-motion poses, with sfm_worker running pycolmap in a child process)."""
