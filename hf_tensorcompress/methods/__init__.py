"""The built-in compression methods, one package each: ``__init__.py`` (its ``MethodRecord``: name, description,
example, where the rest lives), ``config.py`` (its options), ``layer.py`` (the replacement layer, shipped inside
checkpoints) and ``apply.py`` (``METHOD``: how the layer is built from a target module).

Every subpackage here is a method: the registry (``core/registry.py``) imports them at its first lookup, which
registers their records; their build code loads when a method is first used.
"""
