"""Images (``mmproj``): the projector and a prompt's images (``projector``), images inside the step as a step feature (``steps``), the side context for images beside other streams (``side``), M-RoPE positions (``mrope``); docs/internals/vision.md.
"""
