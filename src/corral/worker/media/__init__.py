"""Everything a prompt carries besides text (``mmproj``; images now): what a prompt with media is
(``prompt``: ``MediaPrompt``, ``MediaChunk`` and the questions the step asks of any prompt), the
chunk kinds (``image``), the projector that makes them (``projector``: ``CHUNK_KINDS``), chunks
inside the step as a step feature (``steps``), the side context beside other streams (``side``),
M-RoPE positions (``mrope``); docs/internals/media.md.
"""
