"""The arms a comparison may add by name in ``--runs``, as patterns. Torch-free: ``byte_comparison.py`` checks the
names before it launches a run, and ``byte_arms.py`` reads the settings out of them."""

from __future__ import annotations

import re

#: ``lowbit-<bits>-g<group>[-learned][-fp16-bias][-hadamard][-after-dense-<fraction>]``: the ``lowbit`` method on
#: every Linear, trained quantization-aware from the first step (``-learned``: with ``weight_scales="learned"``;
#: ``-fp16-bias``: ``bias_dtype="float16"``; ``-hadamard``: every Linear but the first with that ``input_rotation``;
#: ``-after-dense-<f>``: from the weights of the first ``f`` of the steps trained dense, the rest quantization-aware).
LOWBIT_ARM = re.compile(
    r"lowbit-(16|8|4|3|2|1|ternary)-g(\d+)(-learned)?(-fp16-bias)?(-hadamard)?(?:-after-dense-(0\.\d*[1-9]\d*))?"
)
#: ``rows-<bits>-<fraction>``: the first ``fraction`` of every Linear's rows at ``bits``, the rest ternary.
ROWS_ARM = re.compile(r"rows-(8|4|3|2)-(0\.\d*[1-9]\d*)")
#: ``ends-<bits>-<bits>[-<bits>]``: the first Linear at the first width, the last at the second, every other one at
#: the third (ternary if not given; 4, 3, 2 or 1 bit) (``method="mixed"``: learned scales in groups of 128, fp16
#: biases); ``-hadamard`` / ``-randomized-hadamard``: every Linear but the first with that ``input_rotation`` (blocks of
#: 128, or the largest power of two its inputs allow).
ENDS_ARM = re.compile(r"ends-(8|4|3|2)-(8|4|3|2)(?:-(4|3|2|1))?(?:-((?:randomized-)?hadamard))?")
#: ``vq-<dim>-<bits>``: every Linear's weight as runs of ``dim`` weights, each an index of ``bits`` into a codebook.
VQ_ARM = re.compile(r"vq-(2|4|8)-([1-9]|1[0-2])")
#: ``narrow-<d_model>[x<layers>][-ffn<width>][-shared][-<arm>]``: a fresh model of that narrower width (its FFN and
#: heads scaled with it, the head dimension kept; ``x<layers>``: that many encoder layers; ``-ffn<width>``: that FFN
#: width instead; ``-shared``: every encoder layer after the first reuses the first's Linears, ``{"method": "shared"}``,
#: dense or an ``ends-`` arm's forms) trained as it is or as that ``lowbit-``, ``rows-``, ``ends-`` or ``vq-`` arm: the
#: smaller model a user could train instead, its bytes counted against the full model's fp32 Linears.
NARROW_ARM = re.compile(
    rf"narrow-([1-9]\d*)(?:x([1-9]\d*))?(?:-ffn([1-9]\d*))?(-shared)?(?:-({'|'.join(arm.pattern for arm in (LOWBIT_ARM, ROWS_ARM, ENDS_ARM, VQ_ARM))}))?"
)
#: Any of them.
NAMED_ARM = re.compile("|".join(arm.pattern for arm in (LOWBIT_ARM, ROWS_ARM, ENDS_ARM, VQ_ARM, NARROW_ARM)))
#: How the named arms are spelled, for a message that refuses a name.
NAMED_ARM_FORMS = (
    "lowbit-<bits>-g<group>[-learned][-fp16-bias][-hadamard][-after-dense-<fraction>], rows-<bits>-<fraction>, "
    "ends-<bits>-<bits>[-<bits>][-hadamard|-randomized-hadamard], vq-<dim>-<bits> or "
    "narrow-<d_model>[x<layers>][-ffn<width>][-shared][-<any of these>]"
)
