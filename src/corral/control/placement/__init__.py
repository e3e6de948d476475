"""Which models are loaded and on which device: the memory budget, load order and eviction
(``admission``), the GPUs' budgets and an instance's placement (``gpus``, ``gpu_slot``)."""
