"""The version of ddp_utils users install and cite, written once: here.

``pyproject.toml`` reads it from this file without importing the package (``attr =
"ddp_utils.version.__version__"``: a build needs no torch), ``ddp_utils.__version__`` re-exports it, each
checkpoint records it, and CHANGELOG.md says what each version changed. A bottom module, so the checkpoint
writer (``ddp_utils.run``) reads it without importing the package's face.
"""

__version__ = "0.1.0"
