"""The package version (a module of its own so that every layer can read it)."""

__version__ = "0.1.0"
