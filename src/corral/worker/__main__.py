"""``python -m corral.worker --fd N --settings JSON``: one model instance."""

from __future__ import annotations

import sys

from corral.worker.process import main

if __name__ == "__main__":
    sys.exit(main())
