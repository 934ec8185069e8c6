"""The package's version, importable without the native core or torch."""

__version__ = "0.1.0"
