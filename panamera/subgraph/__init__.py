"""The subgraph optimizer: ONNX models in, fused Panamera kernels out.

Modules, each importing only those listed before it:
model.py loads an ONNX model, fixes its input shapes, folds constants and infers shapes;
convert.py holds the op table (CONVERTERS) and turns ONNX nodes into Panamera tensors;
library.py runs the nodes Panamera leaves to the array library (numpy/CuPy, onnx's reference);
partition.py groups the nodes Panamera takes into convex subgraphs;
verify.py compares values with onnx's reference evaluator;
optimizer.py compiles the subgraphs, runs the whole model and verifies it;
report.py writes the kernels and the JSON and markdown report.
"""

from .model import OnnxModel, load_model
from .optimizer import OptimizedModel, optimize

__all__ = ["OnnxModel", "OptimizedModel", "load_model", "optimize"]
