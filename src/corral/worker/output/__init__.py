"""What a generating slot sends: its text pipeline (``slot_output``), whole characters and stop strings (``detokenize``), tool calls out of the stream (``toolcalls``), infill's prompt and output (``infill``).
"""
