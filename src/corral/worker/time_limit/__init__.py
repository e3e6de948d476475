"""``t_max_predict_ms``: llama-server's time limit for generation, a step feature.

A request with ``t_max_predict_ms > 0`` ends with ``length`` at the first token after both its
generation (from its first token) has run longer than that and its output holds a new line
(llama-server's rule: a code completion ends at a line's end). ``state`` holds the slot's
state (``Slot.time_limit``), ``feature`` the ``StepFeature``.
"""
