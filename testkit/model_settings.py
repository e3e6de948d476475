"""The context a test model runs with when its test sets none.

corral's own default is 32,768 cells a slot (``corral.model.settings.DEFAULT_SLOT_CTX``), about
400 MiB of KV for the embedded model at 4 slots; the suite's models run with 1,024 a slot at
the default 4 slots (the total ``ctx_len`` corral defaulted to before), so its speed and
memory do not depend on that default, and with 4 slots (``TEST_N_PARALLEL``) where corral's default sizes
them from memory. Every router config of the tests' harness
(``tests/support/harness.py``: ``[defaults]``), worker settings built by a test and config
file written by one states it; a test about the default itself sets ``ctx_len`` to nothing.
"""

__all__ = ["TEST_CTX_LEN", "TEST_N_PARALLEL"]

TEST_CTX_LEN = 4096  # total KV cells (per slot: TEST_CTX_LEN // n_parallel)
# the slots of a test model whose test sets none: corral's default ("auto", sized from the
# host's memory, up to 64) would make every test worker's KV depend on the machine; a test
# about "auto" itself sets n_parallel to nothing
TEST_N_PARALLEL = 4
