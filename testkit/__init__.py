"""What the tests and the benchmarks share, so neither imports the other's tree.

- ``gguf_raw``, ``gguf_models``, ``gguf_lora``, ``gguf_vision``, ``gguf_qwen2vl``, ``draft_models``:
  small GGUF models written offline with the PyPI ``gguf`` writer (a FIM vocabulary, a reranker,
  a LoRA, projectors, drafts), from the embedded model or from random weights.
- ``gguf_audio``: a Qwen2-Audio projector (``qwen2a``: Whisper encoder, 750 positions a 30 s
  window) on the embedded model; ``audio_files``: recordings encoded in each container a client sends.
- ``model_settings``: ``TEST_CTX_LEN`` and ``TEST_N_PARALLEL``, the context and slots of a test model whose test sets none.
- ``ray_cluster``: a local Ray cluster on loopback only (the Ray tests and ``bench/ray``).

``tests/`` and ``bench/`` import from here; ``testkit`` imports neither (``tests/test_layout.py``).
"""
