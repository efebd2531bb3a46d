"""The version of arrayfeed, written once: ``pyproject.toml`` reads it from here."""

__version__ = "0.1.0.dev0"
