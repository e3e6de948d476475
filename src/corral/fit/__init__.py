"""The memory-fit calculation: how much of a model goes where, as llama.cpp will place it.

One calculation for both sides, so that what the router charges a GPU is what the worker
loads there (docs/internals/gpu-placement.md). Its modules:

- ``corral.fit.layout``: a model's memory by layer (``read_layout``: the GGUF tensor table).
- ``corral.fit.plan``: ``n_gpu_layers = "auto"``'s plan (``plan_fit``), each GPU's need (``device_needs``) and
  where a loaded model's parts are (``placement``).
- ``corral.fit.split``: llama.cpp's split of the layers over several GPUs, in float32, and
  the ``tensor_split`` corral gives it.
- ``corral.fit.draft``: a draft model's file, settings and per-GPU need (``speculative = "draft"``).
- ``corral.fit.host``: a load with no GPU layers: its context (``host_ctx``) and bytes (``host_bytes``).
- ``corral.fit.estimate``: will a model fit, before a download or a load (``estimate``: the page's badges).
- ``corral.fit.rows``: the logits rows a context may ask for (``n_outputs_max``).
- ``corral.fit.sizes``: a context's memory by device as llama.cpp sizes it (``Sizes``), for both plans.
- ``corral.fit.slots``: ``n_parallel = "auto"``'s slots from the memory left after the weights
  (``plan_slots``, ``with_slots``).

Neutral: imports only ``corral.wire``, ``corral.model.settings`` and ``corral.model.gguf_header``, never
``llama_cpp``; the worker plans its load with it, the router estimates and places with it.
"""
