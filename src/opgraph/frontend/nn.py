"""Neural-network functions on lazy arrays (exported as ``opgraph.nn``).

    >>> import opgraph.numpy as onp
    >>> from opgraph import nn
    >>> nn.relu(onp.asarray([-1.0, 2.0])).eval()
    array([0., 2.])
"""

from __future__ import annotations

from typing import Any

from opgraph.frontend.lazy import LazyArray, apply


def relu(x: Any, /) -> LazyArray:
    """max(x, 0).

    >>> import opgraph.numpy as onp
    >>> relu(onp.asarray([-3, 3])).eval()
    array([0, 3])
    """
    return apply("relu", x)


def sigmoid(x: Any, /) -> LazyArray:
    """1 / (1 + exp(-x)).

    >>> import opgraph.numpy as onp
    >>> sigmoid(onp.asarray([0.0])).eval()
    array([0.5])
    """
    return apply("sigmoid", x)


def softmax(x: Any, /, axis: int = -1) -> LazyArray:
    """Softmax along ``axis`` (computed with the max shift).

    >>> import opgraph.numpy as onp
    >>> softmax(onp.asarray([0.0, 0.0])).eval()
    array([0.5, 0.5])
    """
    return apply("softmax", x, axis=axis)


def log_softmax(x: Any, /, axis: int = -1) -> LazyArray:
    """Log of the softmax along ``axis``.

    >>> import opgraph.numpy as onp
    >>> log_softmax(onp.asarray([0.0, 0.0])).eval().round(4)
    array([-0.6931, -0.6931])
    """
    return apply("log_softmax", x, axis=axis)


def conv2d(x: Any, w: Any, /, *, stride: Any = (1, 1), padding: Any = (0, 0), dilation: Any = (1, 1),
           groups: int = 1) -> LazyArray:
    """2-D convolution (cross-correlation), NCHW input, OIHW weights, as PyTorch.

    >>> import opgraph.numpy as onp
    >>> conv2d(onp.ones((1, 1, 4, 4)), onp.ones((2, 1, 3, 3)), padding=(1, 1)).shape
    (1, 2, 4, 4)
    """
    return apply("conv2d", x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)


def max_pool2d(x: Any, /, kernel_size: Any, *, stride: Any = None, padding: Any = (0, 0)) -> LazyArray:
    """Max pooling over NCHW windows.

    >>> import opgraph.numpy as onp
    >>> max_pool2d(onp.ones((1, 1, 4, 4)), (2, 2)).shape
    (1, 1, 2, 2)
    """
    return apply("max_pool2d", x, kernel_size=kernel_size, stride=stride, padding=padding)


def avg_pool2d(x: Any, /, kernel_size: Any, *, stride: Any = None, padding: Any = (0, 0),
               count_include_pad: bool = True) -> LazyArray:
    """Average pooling over NCHW windows.

    >>> import opgraph.numpy as onp
    >>> avg_pool2d(onp.ones((1, 1, 4, 4)), (2, 2)).eval().ravel()
    array([1., 1., 1., 1.])
    """
    return apply("avg_pool2d", x, kernel_size=kernel_size, stride=stride, padding=padding,
                 count_include_pad=count_include_pad)
