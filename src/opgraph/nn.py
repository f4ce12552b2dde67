"""``opgraph.nn``: neural-network functions on lazy arrays (see :mod:`opgraph.frontend.nn`).

    >>> import opgraph.numpy as onp
    >>> import opgraph.nn as nn
    >>> nn.softmax(onp.zeros(4)).eval()
    array([0.25, 0.25, 0.25, 0.25])
"""

from opgraph.frontend.nn import avg_pool2d, conv2d, log_softmax, max_pool2d, relu, sigmoid, softmax

__all__ = ["avg_pool2d", "conv2d", "log_softmax", "max_pool2d", "relu", "sigmoid", "softmax"]
