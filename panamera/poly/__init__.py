"""The polyhedral stage: isl statements, loop coalescing, dependences, fusion and stitching."""
