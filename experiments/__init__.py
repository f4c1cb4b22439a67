"""The lab: questions asked of the model, each with its command, result and verdict (never imported by sia/, server/
or benchmarks/; see tests/test_architecture.py)."""
