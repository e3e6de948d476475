"""Reasoning, a step feature: what a request asks and the slot's state (``plan``: ``ReasoningPlan``, ``SlotReasoning``), the thinking/answer split (``split``), the feature (``feature``); docs/internals/reasoning.md.
"""
