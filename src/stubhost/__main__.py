"""``python -m stubhost``: the ``stubhost`` command."""

import sys

from stubhost.cli import main

sys.exit(main())
