"""The code compressed checkpoints ship: the ``Compressed<Base>`` model classes, the layer contract, packed storage
and its C kernels, the loading checks, atomic saves, the torchao adapter of stacked checkpoints.

Every file here imports only the standard library, torch, transformers and other files of this folder, so
``trust_remote_code`` can load a checkpoint holding them where hf_tensorcompress is not installed. A checkpoint
carries only the files its layers and options import (``core/export.py`` derives the list); the methods' layer
files (``methods/<method>/layer.py``) are shipped beside them and import only this folder.
"""
