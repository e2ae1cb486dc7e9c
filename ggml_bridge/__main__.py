"""``python -m ggml_bridge`` runs the command line."""

import sys

from .cli import main

sys.exit(main())
