"""Text from outside made safe to print on a terminal or in a log line.

Provider error bodies, model answers, prompts and dataset fields can carry terminal control sequences: an error
body with ``ESC ] 0 ; title BEL`` retitles the user's terminal, ``ESC [ 2 J`` clears it, and others can rewrite
what is on screen or, on some terminals, write to the clipboard (OSC 52). Everything such a text contains that
a terminal would act on is dropped before it is printed: ANSI sequences (CSI, OSC, DCS, SOS, PM, APC and the
short ESC ones, in their 7-bit and 8-bit forms) with their parameters, then every remaining C0 control, DEL and
C1 control. Newlines and tabs are kept where a multi-line text is shown on purpose (``newlines=True``), and
turned into spaces otherwise. Reports written as HTML, JSON or CSV keep their own escaping and do not use this.

Why not a library's: rich strips only BEL, BS, VT, FF and CR (``rich.control.strip_control_codes``, which its
``Text`` applies) and lets ESC through; its ANSI decoder (``Text.from_ansi``) reads an OSC only when ended by
``ESC \\``, not by the BEL terminals also accept, and keeps other controls; click's ``unstyle`` removes only CSI
sequences. None removes C1 controls, so the 30 lines below do it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["clean", "clean_lines"]

#: sequences a terminal acts on, with their parameters (ECMA-48 / xterm's ctlseqs)
_SEQUENCES = re.compile(
    r"(?:\x1b\]|\x9d)[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL or ST (an unended one stops at a newline)
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c\n]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC ... ST
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI: parameters, intermediates, final byte
    r"|\x1b[ -/]*[0-~]?"  # the other ESC sequences (charset selection, keypad modes, RIS ...), or a lone ESC
)
#: any control character at all: texts without one (nearly all) are returned as they are
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: the controls left once sequences are gone, newline and tab apart
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: object, *, newlines: bool = False) -> str:
    """``text`` (made a string) without terminal control sequences or control characters. ``newlines``: keep
    newlines and tabs (a multi-line text shown as such); else they become spaces, for a one-line display."""
    text = text if isinstance(text, str) else str(text)
    if not _ANY_CONTROL.search(text):
        return text
    text = _SEQUENCES.sub("", text.replace("\r\n", "\n"))
    text = _CONTROLS.sub("", text)
    return text if newlines else text.replace("\n", " ").replace("\t", " ")


def clean_lines(lines: Iterable[object]) -> list[str]:
    """Each of ``lines`` cleaned, the newlines and tabs inside a line kept."""
    return [clean(line, newlines=True) for line in lines]
