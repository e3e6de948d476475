"""Speculative decoding, a step feature: drafts verified in the step's one decode.

``state`` (``SlotSpec``, the slot's ``spec`` field), ``speculator`` (n-gram drafts, the
draws and the rollback), ``draft`` (a draft model), ``cost`` (how long a draft pays);
docs/internals/speculation.md.
"""
