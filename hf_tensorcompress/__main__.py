"""``python -m hf_tensorcompress``: the ``hf-tensorcompress`` command line."""

from .cli import main

raise SystemExit(main())
