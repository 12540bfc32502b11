"""The subgraph optimizer: ONNX models in, fused Panamera kernels out.

model.py loads and folds an ONNX model; convert.py turns ONNX ops into Panamera tensors;
partition.py groups memory-intensive nodes into subgraphs; optimizer.py compiles, runs,
verifies and reports them; schedules.py saves and reloads the mapping decisions.
"""

from .model import OnnxModel, load_model
from .optimizer import OptimizedModel, optimize

__all__ = ["OnnxModel", "OptimizedModel", "load_model", "optimize"]
