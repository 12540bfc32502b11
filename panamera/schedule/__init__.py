"""Mapping of kernel groups onto the GPU: block/thread binding, vector width, multi-block split."""
