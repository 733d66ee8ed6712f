"""Entry point of ``python -m stubhost.stub``."""

import sys

from stubhost.stub.runtime import main

arguments = sys.argv[1:]
# The model sees the argv of Triton's embedded interpreter, [""]: model code that parses it
# (``unittest.main`` in a model, argparse defaults) must not find the stub's launch argument.
sys.argv = [""]
sys.exit(main(arguments))
