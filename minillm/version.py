"""The release, in a module of its own: the course setup and pyproject.toml read it without
importing the engine."""

__version__ = "0.1.0"
