"""What ``/proc`` says about a process group: its members and their ``stat`` fields.

Below every package that starts processes (the dev stack, the vLLM launcher, the benches),
so each of them can ask after a group it started without importing the others.
"""

from __future__ import annotations

from pathlib import Path


def group_members(pgid: int) -> dict[int, list[str]]:
    """pid -> the ``/proc/<pid>/stat`` fields (after the command name) of every process in
    process group ``pgid``: field 0 is the state, 2 the group, 11/12 user/system ticks."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            members[int(entry.name)] = fields
    return members
