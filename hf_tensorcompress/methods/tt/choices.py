"""The fixed value sets of tt's options that its shipped code checks too; plain data (the config imports no torch).

Ships inside tt checkpoints (the solver imports it).
"""

#: TT-SVD solvers: ``eigh`` (exact, every singular value), ``power`` (fixed ranks), ``auto`` (picks by size).
TT_SOLVERS = ("auto", "eigh", "power")
