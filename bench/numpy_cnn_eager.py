"""The benchmark CNN of bench/backends_workloads.py ``cnn_graph()`` written the usual way in NumPy (eager).

Each convolution is ``np.pad`` + ``sliding_window_view`` + ``np.tensordot`` over the
(C, kH, kW) axes, as a NumPy user would write it; the reference the NumPy engine's
CNN time is compared with.

    >>> import numpy as np
    >>> from backends_workloads import cnn_data
    >>> params, x = cnn_data()
    >>> numpy_eager_cnn(params, x[:2]).shape
    (2, 10)
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def conv2d_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride-1 convolution of x (N, C, H, W) with w (O, C, k, k), zero padding k // 2 ("same").

    >>> conv2d_same(np.ones((1, 1, 3, 3)), np.ones((1, 1, 3, 3)))[0, 0]
    array([[4., 6., 4.],
           [6., 9., 6.],
           [4., 6., 4.]])
    """
    p = w.shape[-1] // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    win = sliding_window_view(xp, w.shape[-2:], axis=(2, 3))  # (N, C, H, W, kH, kW)
    y = np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3)))  # (N, H, W, O)
    return y.transpose(0, 3, 1, 2)


def numpy_eager_cnn(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Logits (N, classes) of cnn_graph's network: conv, a residual block of two convs, 2x2 max pool,
    global mean and a linear layer, with the weights of ``cnn_data()``.

    >>> rng = np.random.default_rng(0)
    >>> p = {"w1": rng.standard_normal((4, 3, 3, 3)), "w2": rng.standard_normal((4, 4, 3, 3)),
    ...      "w3": rng.standard_normal((4, 4, 3, 3)), "b1": np.zeros(4), "b2": np.zeros(4), "b3": np.zeros(4),
    ...      "fc": rng.standard_normal((4, 10)), "fcb": np.zeros(10)}
    >>> numpy_eager_cnn(p, rng.standard_normal((2, 3, 8, 8))).shape
    (2, 10)
    """
    def bias(v: np.ndarray, name: str) -> np.ndarray:
        return v + params[name].reshape(1, -1, 1, 1)

    h1 = np.maximum(bias(conv2d_same(x, params["w1"]), "b1"), 0)
    h2 = np.maximum(bias(conv2d_same(h1, params["w2"]), "b2"), 0)
    h3 = bias(conv2d_same(h2, params["w3"]), "b3")
    h = np.maximum(h3 + h1, 0)
    n, c, hh, ww = h.shape
    pooled = h[:, :, :hh // 2 * 2, :ww // 2 * 2].reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    return pooled.mean(axis=(2, 3)) @ params["fc"] + params["fcb"]
