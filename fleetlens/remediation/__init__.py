"""Auto-cordon: decide, drain at a step boundary, verify the checkpoint, remove the node, resume."""
