"""pytest at the repository root: `--doctest-modules panamera` skips the torch integration
(panamera/torch_backend/) where PyTorch is not installed; it is an optional dependency."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["panamera/torch_backend/*"]
