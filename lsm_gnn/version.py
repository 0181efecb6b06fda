"""The package version, in a module of its own: the dataset writers record it without importing the package's
face (lsm_gnn/__init__.py, which imports them)."""
__version__ = "0.1.0"
