"""Third-party log lines the library drops: harmless lines that every model load would otherwise print once torchao is
installed (transformers imports it with its quantizers, and torchao logs the prebuilt kernels a CPU install cannot
load, then torch its deprecation notes about torchao's enums), and bitsandbytes' note about a Hub kernel it does
without. Installed when ``hf_tensorcompress`` is imported.

Each entry names the logger that emits the line and a pattern of the line itself, so anything else those libraries
log (a real error, another warning) still shows.
"""

from __future__ import annotations

import logging
import re

#: ``(logger name, message pattern)`` of the dropped lines.
NOISE = (
    # torchao's prebuilt kernels for CUDA or another Python (e.g. _C_mxfp8.cpython-310-*.so) that a CPU install
    # cannot load; the CPU paths the library uses do not need them
    ("torchao", re.compile(r"^Failed to load \S*torchao\S*/_C\S*\.so: ")),
    # bitsandbytes on a CPU with AVX512-BF16 tries a Hub kernel package (`kernels`) for its 4-bit product and falls
    # back to its own CPU path when it is absent: the fallback is what runs here, and the Hub is not reachable anyway
    ("bitsandbytes.backends.cpu.ops", re.compile(r"^Failed to load CPU gemm_4bit_forward from kernels-community: ")),
    # torch's deprecation note about torchao registering its enums as pytree constants (torchao's code, not ours)
    (
        "torch.utils._pytree",
        re.compile(r"is an Enum subclass .* register_constant\(\) on Enum subclasses is deprecated"),
    ),
)


class DropMatching(logging.Filter):
    """Drops the records whose message matches ``pattern``."""

    def __init__(self, pattern: re.Pattern) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def silence_third_party_noise() -> None:
    """Attach a ``DropMatching`` filter for every ``NOISE`` entry to its logger (once, however often it is called)."""
    for name, pattern in NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMatching) and f.pattern is pattern for f in logger.filters):
            logger.addFilter(DropMatching(pattern))
