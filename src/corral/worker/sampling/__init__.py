"""Drawing a slot's next token: the samplers (``sampler``), the short candidate list (``candidates``), the draws side by side (``pool``), JSON schema to grammar (``grammar``); docs/internals/sampling.md.
"""
