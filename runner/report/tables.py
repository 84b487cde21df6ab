"""One table in the reports' four formats: ``runner costs``, ``runner costs RUN --as``, ``runner estimate`` and
``runner runs`` each describe their table (:class:`Column`: a header, its alignment, a least width) and give its
rows as text cells; this module lays them out as text or Markdown. CSV and JSON are written from the report's
plain data, not its text cells (a CSV column holds the number, the text cell "$1,234.5000"): :func:`csv_text` and
:func:`json_text`.

Text, as the reports print it: by default every column is as wide as its widest cell, left-aligned unless
``right``, columns two spaces apart, each line's trailing spaces dropped. ``fit=False`` pads each cell to its
column's ``width`` alone (a long cell pushes its own line only, as Python's ``f"{cell:<22}"``) and keeps the lines
as they are (``runner runs``).

Markdown: a header row, a rule whose right-aligned columns end in ``:``, a row per row; cells as given (the
reports' cells hold no ``|``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Column", "Table", "csv_text", "json_text"]


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table."""

    #: its header, in text and Markdown
    header: str
    #: aligned right (numbers): padded on the left in text, ``---:`` in Markdown
    right: bool = False
    #: the least width of its cells in text
    width: int = 0
    #: the text before it on a text line (None: the table's gap); nothing before the first column
    gap: str | None = None


@dataclass(slots=True)
class Table:
    """Columns and rows of text cells, one cell per column."""

    columns: Sequence[Column]
    rows: Sequence[Sequence[str]]

    def text(self, *, gap: str = "  ", fit: bool = True) -> list[str]:
        """The header line and one line per row."""
        if fit:
            widths = [max(c.width, len(c.header), *(len(row[i]) for row in self.rows))
                      for i, c in enumerate(self.columns)]
        else:
            widths = [c.width for c in self.columns]
        return [self._line([c.header for c in self.columns], widths, gap, fit)] + \
            [self._line(row, widths, gap, fit) for row in self.rows]

    def _line(self, cells: Sequence[str], widths: list[int], gap: str, strip: bool) -> str:
        parts = []
        for i, (cell, column, width) in enumerate(zip(cells, self.columns, widths, strict=True)):
            if i:
                parts.append(gap if column.gap is None else column.gap)
            parts.append(cell.rjust(width) if column.right else cell.ljust(width))
        line = "".join(parts)
        return line.rstrip() if strip else line

    def markdown(self) -> list[str]:
        """The header row, the rule, one row per row."""
        return ["| " + " | ".join(c.header for c in self.columns) + " |",
                "|" + "".join("---:|" if c.right else "---|" for c in self.columns)] + \
            ["| " + " | ".join(row) + " |" for row in self.rows]


def csv_text(fields: Sequence[str], rows: Iterable[Mapping[str, Any]], *, lineterminator: str = "\r\n") -> str:
    """A header of ``fields`` and one line per row (a row's other keys left out), as the csv module writes them
    (``\\r\\n`` line ends by default)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator=lineterminator)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def json_text(data: Any) -> str:
    """A report's plain data as indented JSON (text kept as it is, not escaped to ASCII), one newline at the end."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
