"""Types of pydory_tools._cloadgen (the C source: _cloadgen.c)."""

def send_writes(
    fd: int, writes: list[bytes], start: int, count: int, stream: bool, deadline: float
) -> int: ...
