"""The one place where the package version is defined."""

__version__ = "3.0.0"
