"""CUDA C code generation: isl AST → loops, plus the reduction routines of header.py."""
