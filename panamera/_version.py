"""The version, in one place: pyproject.toml reads it (`[tool.setuptools.dynamic]`), `panamera.__version__`
and `panamera --version` print it, and CHANGELOG.md's newest entry names it."""

__version__ = "0.9.0"
