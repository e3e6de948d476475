"""A request into prompt tokens: tokenizing and checking it (``prompts``), chat templates (``templates``), the generic tool prompt (``tool_prompt``), per-request checks and preparation (``requests``).
"""
