"""Entry point of ``python -m stubhost.stub``."""

import sys

from stubhost.stub.runtime import main

sys.exit(main(sys.argv[1:]))
