"""``python -m trio_kubelet``: the same as the ``trio-kubelet`` command."""

import sys

from trio_kubelet.cli import main

sys.exit(main())
