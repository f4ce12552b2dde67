"""One way to register how an op kind runs on an engine or is written to a format: :class:`RuleTable`.

Every engine (:class:`opgraph.backends.base.Backend` is a rule table) and the
ONNX exporter keep op kind -> rule and op kind -> limit tables, filled by the
same two decorators, in the spirit of PyTensor's ``@jax_funcify.register(Op)``:

* ``@table.rule("logaddexp", ...)`` registers the decorated function as the
  rule of each kind named (what a rule takes and returns is the table's own
  business: a backend's rule is a factory called once per op with its
  :class:`~opgraph.core.opinfo.OpInfo`; the exporter's writes ONNX nodes);
* ``@table.limit("logaddexp", ...)`` registers why the table cannot take one
  op of those kinds (``OpInfo -> str | None``; None: it can).

A table-wide rule built from a dict (``{"exp": jnp.exp, ...}``) is
registered with :meth:`RuleTable.rules_from`. The tables are plain dicts
(``table.rules``, ``table.limits``), so they read and test like data; each
table also records the module that registered each rule
(:meth:`RuleTable.rule_module`), which is how ``tests/test_layout.py`` checks
that a rule stands in the module named after its op's family.

Adding how an op runs on an engine is one decorated function in the engine's
module named after the op's family (``backends/torch/elementwise.py`` for
``logaddexp``): ``@BACKEND.rule("logaddexp")``; see :mod:`opgraph.backends.base`.

    >>> table = RuleTable.empty()
    >>> @table.rule("exp", "exp2")
    ... def exp_rule(info):
    ...     return lambda x: x
    >>> @table.limit("exp")
    ... def exp_limit(info):
    ...     return None
    >>> sorted(table.rules), list(table.limits)
    (['exp', 'exp2'], ['exp'])
    >>> table.rule("exp")(lambda info: None)
    Traceback (most recent call last):
    ...
    ValueError: a rule for 'exp' is registered already (exp_rule); registering one twice hides the first
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class RuleTable:
    """Op kind -> rule and op kind -> limit, filled by :meth:`rule` and :meth:`limit` (see the module doc).

    Subclasses (dataclasses such as :class:`~opgraph.backends.base.Backend`) declare ``rules`` and ``limits``
    as their own fields; :meth:`empty` makes a bare table.
    """

    rules: dict[str, Any]
    limits: dict[str, Callable[..., str | None]]

    @classmethod
    def empty(cls) -> RuleTable:
        """A table with no rules and no limits.

        >>> RuleTable.empty().rules
        {}
        """
        table = cls.__new__(cls)
        table.rules, table.limits = {}, {}
        return table

    def rule_module(self, kind: str) -> str | None:
        """The module that registered the rule of ``kind`` (None: not registered through :meth:`rule`).

        >>> t = RuleTable.empty()
        >>> _ = t.rule("add")(lambda info: None)
        >>> t.rule_module("add")
        'opgraph.core.ruletable'
        """
        return self.__dict__.get("rule_modules", {}).get(kind)  # type: ignore[no-any-return]

    def rule(self, *kinds: str, replace: bool = False, module: str | None = None) -> Callable[[F], F]:
        """Register the decorated function as the rule of each of ``kinds``.

        Registering a second rule for a kind is an error (one op, one rule per table) unless ``replace``,
        which a user's table derived from a built-in one uses to override it.

        >>> t = RuleTable.empty()
        >>> _ = t.rule("add")(lambda info: None)
        >>> _ = t.rule("add", replace=True)(lambda info: 1)
        >>> t.rules["add"](None)
        1
        """
        where = module if module is not None else sys._getframe(1).f_globals.get("__name__", "?")
        modules = self.__dict__.setdefault("rule_modules", {})

        def register(fn: F) -> F:
            for kind in kinds:
                if not replace and kind in self.rules and self.rules[kind] is not fn:
                    raise ValueError(f"a rule for {kind!r} is registered already "
                                     f"({getattr(self.rules[kind], '__name__', self.rules[kind])}); "
                                     "registering one twice hides the first")
                self.rules[kind] = fn
                modules[kind] = where
            return fn
        return register

    def limit(self, *kinds: str, replace: bool = False) -> Callable[[F], F]:
        """Register the decorated function (``OpInfo -> why not, or None``) as the limit of each of ``kinds``.

        >>> t = RuleTable.empty()
        >>> _ = t.limit("sort")(lambda info: "no stable sort")
        >>> t.limits["sort"](None)
        'no stable sort'
        """
        def register(fn: F) -> F:
            for kind in kinds:
                if not replace and kind in self.limits and self.limits[kind] is not fn:
                    raise ValueError(f"a limit for {kind!r} is registered already; registering one twice "
                                     "hides the first")
                self.limits[kind] = fn
            return fn
        return register

    def rules_from(self, table: Mapping[str, Any], make: Callable[[Any], Any] | None = None, *,
                   replace: bool = False) -> None:
        """Register ``make(entry)`` (or ``entry``) as the rule of each kind of ``table``.

        >>> t = RuleTable.empty()
        >>> t.rules_from({"neg": "Neg", "abs": "Abs"}, str.upper)
        >>> t.rules
        {'neg': 'NEG', 'abs': 'ABS'}
        """
        where = sys._getframe(1).f_globals.get("__name__", "?")
        for kind, entry in table.items():
            self.rule(kind, replace=replace, module=where)(make(entry) if make is not None else entry)
