"""``hf-tensorcompress`` (``python -m hf_tensorcompress``): fetch the offline assets, compress a model, evaluate it,
report its costs, export it to ONNX, push it.

``parser.py`` builds the flags, one module per subcommand (``fetch``, ``compress``, ``evaluate``, ``report``,
``export_onnx``, ``push``) adds its own and runs it, ``main.py`` turns a user's mistake into one ``error:`` line;
``config_flags.py`` makes every ``CompressionConfig`` field a flag, ``messages.py`` words the library's errors in
flags. Building the parser imports no torch: each command imports what it needs when it runs, after checking its
flags.
"""

from __future__ import annotations

from .compress import linear_quantization
from .config_flags import compression_config
from .main import exit_code, main
from .parser import build_parser

__all__ = ["build_parser", "compression_config", "exit_code", "linear_quantization", "main"]
