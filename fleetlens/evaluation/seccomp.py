"""A seccomp filter (classic BPF, as bwrap's ``--seccomp`` takes it) that refuses new user
namespaces: ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with EPERM, ``clone3`` (whose
flags a filter cannot read) with ENOSYS so that libc falls back to ``clone``, and system calls of
another ABI (i386, x32), which would go around the numbers checked, with EPERM.

The evaluation sandbox loads it where bwrap's own ``--disable-userns`` cannot be used (a root
worker that writes the jail's uid map itself). It is built for x86_64 and aarch64; elsewhere
:func:`no_user_namespaces` answers None.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["no_user_namespaces"]

_CLONE_NEWUSER = 0x10000000
# machine: (AUDIT_ARCH_*, unshare, clone, clone3)
_ARCH = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000


def no_user_namespaces(machine: str | None = None) -> bytes | None:
    """The filter as ``struct sock_filter`` records, or None for an architecture not known."""
    arch = _ARCH.get(machine or platform.machine())
    if arch is None:
        return None
    audit, unshare, clone, clone3 = arch
    eperm, enosys, allow = 12, 13, 11  # the indices of the return instructions below
    prog = [
        (_LD_W_ABS, 0, 0, 4),  # 0: seccomp_data.arch
        (_JEQ, 1, 0, audit),  # 1
        (_RET, 0, 0, _ERRNO | errno.EPERM),  # 2: another ABI
        (_LD_W_ABS, 0, 0, 0),  # 3: seccomp_data.nr
        (_JGE, eperm - 5, 0, _X32_BIT),  # 4: x32 numbers
        (_JEQ, enosys - 6, 0, clone3),  # 5
        (_JEQ, 2, 0, unshare),  # 6 -> 9
        (_JEQ, 1, 0, clone),  # 7 -> 9
        (_RET, 0, 0, _ALLOW),  # 8
        (_LD_W_ABS, 0, 0, 16),  # 9: the low half of args[0] (the flags of both)
        (_JSET, eperm - 11, allow - 11, _CLONE_NEWUSER),  # 10
        (_RET, 0, 0, _ALLOW),  # 11
        (_RET, 0, 0, _ERRNO | errno.EPERM),  # 12
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),  # 13
    ]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)
