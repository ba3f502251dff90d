"""Tools: convert, make_index, synthetic (commands), sfm (structure-from-motion poses) and the
inputs of a reconstruction (images with their poses)."""
