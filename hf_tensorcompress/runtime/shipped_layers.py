"""The layer files a checkpoint ships, imported so that their layer types and model options register.

In the package this module imports nothing: a method's layers register when the method registers itself
(``core.registry.register_method``). ``core.export.write_modeling_code`` writes each checkpoint its own version of
this file, one relative import per shipped layer file of the checkpoint's method: that is how the checkpoint's code
knows its layer types, and how transformers learns which files ``trust_remote_code`` must copy.

Ships inside saved checkpoints (as written by ``write_modeling_code``).
"""

from __future__ import annotations

#: The layer and model-option classes a checkpoint ships (none in the package, where methods register them).
LAYER_CLASSES: tuple[type, ...] = ()
