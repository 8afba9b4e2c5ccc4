"""A small seccomp filter for local sandboxes (bwrap --seccomp), in the spirit of docker's default
profile: it refuses the kernel interfaces an unprivileged root can still reach and that container
escapes usually go through. Refused with EPERM: user namespaces (clone/unshare with CLONE_NEWUSER),
bpf, perf_event_open, userfaultfd, the keyring calls, io_uring; clone3 gets ENOSYS (its flags are
out of the filter's sight; libc then falls back to clone). x86-64 only: elsewhere no filter is added.
"""
from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
CLONE_NEWUSER = 0x10000000
X32_BIT = 0x40000000
# x86-64 syscall numbers
CLONE, UNSHARE, CLONE3 = 56, 272, 435
REFUSED = {"bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "add_key": 248, "request_key": 249,
           "keyctl": 250, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000


def _errno(e: int) -> int:
    return 0x00050000 | e


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter as raw `struct sock_filter` records, or None off x86-64."""
    if platform.machine() != "x86_64":
        return None
    p = [_op(_LD_ABS, 4), _op(_JEQ, AUDIT_ARCH_X86_64, 1, 0), _op(_RET, _errno(errno.EPERM)),  # no i386/compat
         _op(_LD_ABS, 0), _op(_JGE, X32_BIT, 0, 1), _op(_RET, _errno(errno.EPERM))]  # no x32 ABI
    for nr in (CLONE, UNSHARE):  # flags are the first argument of both
        p += [_op(_JEQ, nr, 0, 4), _op(_LD_ABS, 16), _op(_JSET, CLONE_NEWUSER, 0, 1),
              _op(_RET, _errno(errno.EPERM)), _op(_RET, _ALLOW)]
    p += [_op(_JEQ, CLONE3, 0, 1), _op(_RET, _errno(errno.ENOSYS))]
    for nr in REFUSED.values():
        p += [_op(_JEQ, nr, 0, 1), _op(_RET, _errno(errno.EPERM))]
    p.append(_op(_RET, _ALLOW))
    return b"".join(p)
