"""``import opgraph.numpy as onp``: NumPy-style lazy arrays (Array API names).

See :mod:`opgraph.frontend.api` for the functions and
:mod:`opgraph.frontend.lazy` for :class:`LazyArray`.

    >>> import opgraph.numpy as onp
    >>> (onp.ones((2, 2)) * 3).sum().eval()
    array(12.)
"""

import sys

from opgraph.frontend import array_methods as _array_methods  # noqa: F401  (sets NumPy's dispatch on LazyArray)
from opgraph.frontend import lazy as _lazy
from opgraph.frontend.api import *  # noqa: F403
from opgraph.frontend.api import __all__ as _api_all
from opgraph.frontend.array_api import *  # noqa: F403
from opgraph.frontend.array_api import __all__ as _array_api_all
from opgraph.frontend.lazy import TracingError, to_graph

__array_api_version__ = "2025.12"
__all__ = [*_api_all, *_array_api_all, "TracingError", "to_graph"]  # placeholder is in api's list already

# LazyArray.__array_namespace__ returns this module; the frontend sits below this façade and cannot import it.
_lazy.ARRAY_NAMESPACE.set(sys.modules[__name__])
