"""The plain executor: run the ops a set of targets needs, in topological order.

Each intermediate is dropped right after its last use. Later layers
(memory planning, fusion, incremental runs) replace the insides; the
interface stays :func:`execute`.

    >>> import numpy as np, opgraph
    >>> from opgraph.runtime.executor import execute
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> y = b.op("multiply", x, 2.0)
    >>> g = b.freeze()
    >>> execute(g, {"x": np.arange(3.0)}, [y.id])
    [array([0., 2., 4.])]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core import hooks, progress
from opgraph.core.feeds import coerce_feed, input_id, value_id
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError, GraphError


def execute(graph: Graph, feeds: Mapping[Any, Any], targets: Sequence[Any] | None = None,
            *, backend: str = "numpy", check: bool = True,
            on_kernel: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Evaluate ``targets`` (default: the graph's outputs) given ``feeds``.

    ``feeds`` maps inputs (ids, names or Values) to arrays; only inputs the
    targets need must be fed. With ``check`` every kernel result is checked
    against the op's declared type, so a wrong kernel cannot pass silently.
    ``on_kernel(op)`` is called before each kernel call (used to count them).
    """
    if backend != "numpy":
        from opgraph.runtime.compiled import run_on

        return run_on(graph, feeds, targets, backend)
    if targets is None:
        targets = list(graph.outputs)
    target_ids = [value_id(graph, t) for t in targets]
    for t in target_ids:
        if not 0 <= t < graph.num_values:
            raise ExecutionError(f"target value {t} does not exist")
    env: dict[int, Any] = {}
    for k, data in feeds.items():
        v = input_id(graph, k)
        env[v] = coerce_feed(graph, v, data)

    needed = graph.needed_ops(target_ids)
    order = graph.topological_order()
    order = order[needed[order]]
    # Every needed input must be fed.
    for t in target_ids:
        if graph.value_producer[t] == -1 and t not in env:
            raise ExecutionError(f"target {graph.value_label(t)} is an input and was not fed")
    if len(order):
        ins = graph.in_ids[needed[np.repeat(np.arange(graph.num_ops), np.diff(graph.in_ptr))]]
        missing = [int(v) for v in np.unique(ins) if graph.value_producer[v] == -1 and int(v) not in env]
        if missing:
            names = ", ".join(f"{graph.value_label(v)}: {graph.type_of(v)}" for v in missing)
            raise ExecutionError(f"missing feed(s) for input(s) {names}")
        # Reference counts among the needed ops; targets are pinned.
        refs = np.bincount(ins, minlength=graph.num_values).tolist()
    else:
        refs = [0] * graph.num_values
    pinned = set(target_ids)

    # The NumPy engine's kernels (its fast ones where it has them), as compiled programs run them; imported
    # here, not at the top, so that `import opgraph` (which installs this module as Graph.run) stays light.
    from opgraph.backends.numpy import BACKEND as engine

    kernels: dict[tuple[int, int], Callable[..., Any]] = {}
    attr_dicts: dict[int, dict[str, Any]] = {}
    in_ptr, in_ids, out_ptr, out_ids = (graph.in_ptr.tolist(), graph.in_ids.tolist(),
                                        graph.out_ptr.tolist(), graph.out_ids.tolist())
    kinds, versions, attr_ids = graph.op_kind.tolist(), graph.op_version.tolist(), graph.op_attr.tolist()
    for op in progress.iterate(order.tolist(), f"run: {len(order):,} ops on numpy"):
        outs = out_ids[out_ptr[op]:out_ptr[op + 1]]
        kind = kinds[op]
        if kind == CONST.id:
            env[outs[0]] = graph.constants[dict(graph.attrs[attr_ids[op]])["index"]]
            continue
        kkey = (kind, versions[op])
        fn = kernels.get(kkey)
        if fn is None:
            try:
                fn = kernels[kkey] = engine.kernel_for(kind, versions[op])
            except (KeyError, NotImplementedError) as exc:
                raise ExecutionError(f"op {op} ({graph.kind_of(op)}): {exc}") from None
        attrs = attr_dicts.get(attr_ids[op])
        if attrs is None:
            attrs = attr_dicts[attr_ids[op]] = dict(graph.attrs[attr_ids[op]])
        args = [env[v] for v in in_ids[in_ptr[op]:in_ptr[op + 1]]]
        if on_kernel is not None:
            on_kernel(op)
        try:
            result = fn(*args, **attrs)
        except GraphError:
            raise
        except ImportError as exc:  # a kernel needing an optional package (SciPy): name the extra installing it
            from opgraph.io.formats import missing_dependency

            raise (missing_dependency(exc, f"op {op} ({graph.kind_of(op)})") or exc) from exc
        except MemoryError as exc:  # Graph.run plans no memory and checks no limit
            from opgraph.memory.limit import out_of_memory

            raise out_of_memory(graph, op, exc, None, setting="in Graph.run, which checks no memory limit "
                                "(opgraph.compile does)") from exc
        except Exception as exc:
            raise ExecutionError(f"op {op} ({graph.kind_of(op)}) failed: {type(exc).__name__}: {exc}") from exc
        if len(outs) == 1:
            result = (result,)
        elif len(result) != len(outs):
            raise ExecutionError(f"op {op} ({graph.kind_of(op)}): kernel returned {len(result)} "
                                 f"results for {len(outs)} outputs")
        for v, r in zip(outs, result, strict=True):
            r = np.asarray(r)
            if check:
                t = graph.type_of(v)
                if isinstance(t, TensorType) and not t.accepts(r):
                    raise ExecutionError(f"op {op} ({graph.kind_of(op)}): kernel produced "
                                         f"{TensorType.of(r)} where the type rule says {t}")
            env[v] = r
        for v in in_ids[in_ptr[op]:in_ptr[op + 1]]:
            refs[v] -= 1
            if refs[v] == 0 and v not in pinned:
                env.pop(v, None)
    return [env[t] for t in target_ids]


# Graph.run lives in core, which may not import this layer; it runs graphs through this hook instead.
hooks.RUN.set(execute)
