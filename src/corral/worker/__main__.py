"""``python -m corral.worker --fd N --settings JSON``: one model instance.

``python -m corral.worker --list-devices``: print the devices llama.cpp sees as a JSON
list of ``wire.DeviceInfo`` and exit (the router's probe, before any worker ran).
"""

from __future__ import annotations

import sys


def _list_devices() -> int:
    import msgspec

    from corral.worker.host.devices import list_devices
    from corral.worker.llama_context import init_backend

    init_backend(False)
    sys.stdout.write(msgspec.json.encode(list_devices()).decode() + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--list-devices"]:
        sys.exit(_list_devices())
    from corral.worker.process import main

    sys.exit(main())
