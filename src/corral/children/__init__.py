"""Child-process plumbing shared by the worker and the download child: frames (frames.py), exit codes in words (exits.py)."""
