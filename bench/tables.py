"""What the benchmark tables share: one table printed with rich and appended to a markdown report."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def emit(console: Console, md: list[str], title: str, columns: list[str], rows: list[list[str]],
         notes: list[str]) -> None:
    """Print one table and its notes; append them to ``md`` as markdown."""
    t = Table(title=escape(title))
    for i, col in enumerate(columns):
        t.add_column(escape(col), justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*map(escape, row))
    console.print(t)
    for note in notes:
        console.print(f"  {note}", style="dim", markup=False, highlight=False)
    md += [f"### {title}", "", "| " + " | ".join(columns) + " |",
           "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    md += [""] + [f"- {note}" for note in notes] + [""]
