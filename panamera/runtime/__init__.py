"""Runtime: launch plans and the backends that run them (emulator, cuda, nvcc)."""
