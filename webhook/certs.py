"""``python -m webhook.certs``: the name the chart's certificate Jobs run (``secret``, ``inject``,
``rotate``), kept for them and for installed charts; the command itself is :mod:`webhook.certgen`, the TLS
material :mod:`webhook.tlsbundle`. Nothing imports this module; it imports only :mod:`webhook.certgen`.
"""

from __future__ import annotations

import sys

from webhook.certgen import main

if __name__ == "__main__":  # pragma: no cover - run as a process by the chart's Jobs and the tests
    sys.exit(main())
