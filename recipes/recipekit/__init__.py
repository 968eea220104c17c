"""What the recipes share: model presets, arm catalogues, cost accounting, runners and reports.

Each recipe in ``recipes/`` is a thin command line over these modules. A recipe run as a script
(``python recipes/smartformer.py``, ``accelerate launch ...``) has its own folder on ``sys.path``, so this package
imports as ``recipekit``; the tests put ``recipes/`` on ``sys.path`` the same way (``pythonpath`` in
``pyproject.toml``).
"""
