"""The subgraph optimizer: ONNX models in, fused Panamera kernels out.

Modules, each importing only those listed before it:
numpy_ops.py evaluates index and shape ops with numpy (folding, library nodes, the reference);
unroll.py unrolls constant Loops and sequence ops for the folder;
model.py loads an ONNX model, fixes its input shapes, folds constants and infers shapes;
convert.py holds the op table (CONVERTERS) and turns ONNX nodes into Panamera tensors;
library.py runs the nodes Panamera leaves to the array library (numpy/CuPy, onnx's reference);
partition.py groups the nodes Panamera takes into convex subgraphs;
verify.py compares values with a float64 reference within derived tolerances;
optimizer.py compiles the subgraphs, runs the whole model, times and verifies it;
deploy.py writes and loads a deployable optimized model (manifest, graph, weights, schedules);
report.py writes the kernels and the JSON and markdown report, with the whole-model figures.
"""

from .deploy import load_optimized, write_deployable
from .model import OnnxModel, load_model
from .optimizer import Measured, OptimizedModel, optimize

__all__ = ["Measured", "OnnxModel", "OptimizedModel", "load_model", "load_optimized", "optimize", "write_deployable"]
