"""The reports' one table renderer (runner/report/tables.py): text fitted or padded cell by cell, Markdown with its
alignment rule, CSV and JSON as the reports write them."""

from __future__ import annotations

import json

from runner.report.tables import Column, Table, csv_text, json_text

TABLE = Table([Column("name"), Column("n", right=True), Column("note")],
              [["alpha", "1", "first"], ["b", "1,234", ""]])


def test_text_fits_each_column_to_its_widest_cell_and_strips_the_line_ends() -> None:
    assert TABLE.text() == ["name       n  note",
                            "alpha      1  first",
                            "b      1,234"]


def test_text_with_no_rows_is_its_header_and_a_least_width_holds() -> None:
    table = Table([Column("a", width=4), Column("b", right=True, width=3)], [])
    assert table.text() == ["a       b"]
    assert table.text(gap=" | ") == ["a    |   b"]


def test_cells_padded_alone_let_a_long_cell_push_its_own_line_only_and_keep_trailing_spaces() -> None:
    table = Table([Column("id", width=4), Column("n", right=True, width=3), Column("when", gap="  ")],
                  [["a", "1", ""], ["a-long-id", "22", "today"]])
    assert table.text(gap=" ", fit=False) == ["id     n  when",
                                              "a      1  ",
                                              "a-long-id  22  today"]


def test_markdown_marks_right_aligned_columns() -> None:
    assert TABLE.markdown() == ["| name | n | note |",
                                "|---|---:|---|",
                                "| alpha | 1 | first |",
                                "| b | 1,234 |  |"]


def test_csv_writes_the_fields_named_in_order_and_leaves_out_the_rest() -> None:
    rows = [{"b": 2, "a": "x,y", "extra": 1}, {"a": None}]
    assert csv_text(("a", "b"), rows) == 'a,b\r\n"x,y",2\r\n,\r\n'
    assert csv_text(("a",), rows, lineterminator="\n") == 'a\n"x,y"\n""\n'  # a lone empty field is quoted


def test_json_is_indented_unescaped_and_ends_in_one_newline() -> None:
    text = json_text({"model": "ü", "n": [1]})
    assert text == '{\n  "model": "ü",\n  "n": [\n    1\n  ]\n}\n'
    assert json.loads(text) == {"model": "ü", "n": [1]}
