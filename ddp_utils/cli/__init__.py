"""Command-line entry points: ``python -m ddp_utils.<command>`` runs ``ddp_utils.cli.<command>.main``."""
