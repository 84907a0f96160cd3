"""Tests of the command-line entry points (python -m ddp_utils.*)."""
