"""A failed load said in one line: the cause a client reads, from the worker's last log lines.

A host agent reports a worker that died as `exit code N: <its log's last lines>`, which often
end in a Python traceback holding the server's paths. Clients get the status and the
exception's own line (MLX's message), each path cut to its file's name; the whole report goes
to the router's log and to the admin API (`failure_detail`).
"""

from __future__ import annotations

import re

MAX_CAUSE_CHARS = 300
_STATUS = re.compile(r"^(exit code -?\d+(?: \(\w+\))?): ", re.DOTALL)
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)\b(?::.*)?$")
_FRAME = re.compile(r"^(?:Traceback \(most recent call last\)|\s|File \"|\^|~)")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s\\/:'\",()\[\]]+)+[\\/]([^\s\\/:'\",()\[\]]+)")


def cause_of(report: str) -> str:
    """`report`'s cause in one line: `exit code N: ErrorName: message` with every path cut
    to its last part (the file's name inside the model directory)."""
    status, tail = "", report
    if match := _STATUS.match(report):
        status, tail = match.group(1), report[match.end() :]
    lines = [line.rstrip() for line in tail.splitlines() if line.strip()]
    exceptions = [line.strip() for line in lines if _EXCEPTION.match(line.strip())]
    plain = [line for line in lines if not _FRAME.match(line)]
    cause = (exceptions or plain or lines or ["(no message)"])[-1]
    cause = _PATH.sub(r"\1", cause)[:MAX_CAUSE_CHARS]
    return f"{status}: {cause}" if status else cause
