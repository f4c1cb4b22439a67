"""The probes are tested on the adapter tests' tiny base and training config."""

from tests.sia.adapter.conftest import base, built, cache, config, one_thread
from tests.sia.conftest import tiny_vocab

__all__ = ["base", "built", "cache", "config", "one_thread", "tiny_vocab"]
