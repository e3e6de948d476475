"""The context a test model runs with when its test sets none.

corral's own default is 32,768 cells a slot (``corral.model.settings.DEFAULT_SLOT_CTX``), about
400 MiB of KV for the embedded model at 4 slots; the suite's models run with 1,024 a slot at
the default 4 slots (the total ``ctx_len`` corral defaulted to before), so its speed and
memory do not depend on that default. Every router config of the tests' harness
(``tests/support/harness.py``: ``[defaults]``), worker settings built by a test and config
file written by one states it; a test about the default itself sets ``ctx_len`` to nothing.
"""

__all__ = ["TEST_CTX_LEN"]

TEST_CTX_LEN = 4096  # total KV cells (per slot: TEST_CTX_LEN // n_parallel)
