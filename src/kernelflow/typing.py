"""Type aliases of the public API.

``ArrayLike`` is what every ``fit``/``predict``/``transform`` accepts: NumPy arrays, pandas
objects, nested lists and torch tensors. ``Output`` is what real-valued outputs are: a NumPy
array or a torch tensor, following the rule of the user guide (NumPy/pandas in gives NumPy out,
torch in gives torch out).

Examples
--------
>>> import numpy as np
>>> from kernelflow.typing import ArrayLike
>>> def n_rows(X: ArrayLike) -> int:
...     return len(X)
>>> n_rows(np.zeros((3, 2)))
3
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["ArrayLike", "Output"]

ArrayLike: TypeAlias = npt.ArrayLike | torch.Tensor
Output: TypeAlias = np.ndarray | torch.Tensor
