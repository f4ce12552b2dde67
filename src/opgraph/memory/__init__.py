"""Schedules and memory plans (issue 5): Owl's Algorithm 1, aligned arena packing, lower bound.

    >>> import opgraph
    >>> from opgraph.memory import plan_memory
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (256,)), name="x")
    >>> b.output(b.op("tanh", b.op("exp", x)))
    >>> plan_memory(b.freeze()).stats()["planned_bytes"]
    1024
"""

from opgraph.memory.limit import check_memory_limit, physical_memory, resolve_memory_limit
from opgraph.memory.plan import ALIGN, Bin, MemoryPlan, OwlPlan, align, check_plan, owl_plan, plan_memory
from opgraph.memory.remat import RematResult, rematerialize
from opgraph.memory.schedule import default_targets, dfs_schedule, greedy_schedule, value_nbytes

__all__ = [
    "ALIGN", "Bin", "MemoryPlan", "OwlPlan", "RematResult", "align", "check_memory_limit", "check_plan",
    "default_targets", "dfs_schedule", "greedy_schedule", "owl_plan", "physical_memory", "plan_memory",
    "rematerialize", "resolve_memory_limit", "value_nbytes",
]
