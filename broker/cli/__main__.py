"""``python -m broker.cli``: the ``acp-broker`` command."""

import sys

from . import main

sys.exit(main())
