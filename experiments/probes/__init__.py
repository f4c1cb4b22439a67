"""Research probes: one module per question, run as ``python -m experiments.probes.NAME`` (README.md here)."""
