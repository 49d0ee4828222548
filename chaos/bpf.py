"""Hand-assembled tc cls_bpf direct-action programs that drop packets, loaded through bpf(2).

No compiler and no libbpf: each program is a few instructions assembled here and loaded
with the bpf syscall through ctypes; `chaos.netlink.add_bpf_filter` attaches the returned
fd at a clsact hook. Programs return TC_ACT_UNSPEC for "not mine" so that several faults
on one hook compose (every filter runs; any of them may drop), and TC_ACT_SHOT to drop, or
TC_ACT_STOLEN at the egress of a host's own interface: there SHOT tells the sending TCP the
drop was local (NET_XMIT_DROP), and it probes every 0.5 s without backing off and gives the
connection up after tcp_retries2 probes (~7.7 s), where a packet lost on the wire is
retransmitted with backoff for minutes; STOLEN reads as sent, then lost.

Loss follows a two-state Markov chain (Gilbert): in the "good" state a packet passes, in
"bad" it is dropped; each packet first moves good->bad with probability `enter` or
bad->good with probability `leave`. Mean loss is enter / (enter + leave) and the mean
burst length 1 / leave. Independent loss is the degenerate chain with enter + leave = 1,
assembled without a state map. The state lives in a one-entry array map owned by the
program, so it disappears with the filter.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct
from dataclasses import dataclass

from chaos.errors import InjectionError

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PSEUDO_MAP_FD = 1
TC_ACT_UNSPEC = -1
TC_ACT_SHOT = 2
TC_ACT_STOLEN = 4
_HELPER_MAP_LOOKUP = 1
_HELPER_PRANDOM_U32 = 7
_R0, _R1, _R2, _R6, _R7, _R10 = 0, 1, 2, 6, 7, 10
_U32_SPAN = 1 << 32

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@dataclass(frozen=True)
class DropChain:
    """Per-packet probabilities of the Gilbert chain (see the module docstring)."""

    enter: float  # good -> bad
    leave: float  # bad -> good

    @classmethod
    def from_loss(cls, loss: float, correlation: float = 0.0,
                  mean_burst: float | None = None) -> "DropChain":
        """Mean loss with either a correlation (P(loss | previous lost) = corr + (1-corr)*loss)
        or a mean burst length in packets; neither: independent loss."""
        if mean_burst is not None:
            leave = 1.0 / mean_burst
            enter = 1.0 if loss >= 1.0 else min(1.0, loss * leave / (1.0 - loss))
            return cls(enter, leave)
        return cls((1.0 - correlation) * loss, (1.0 - correlation) * (1.0 - loss))

    @property
    def independent(self) -> bool:
        return abs(self.enter + self.leave - 1.0) < 1e-12

    @property
    def loss(self) -> float:
        return self.enter / (self.enter + self.leave) if self.enter + self.leave else 0.0


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _threshold(probability: float) -> int:
    """An s32 immediate that an unsigned 32-bit compare reads as probability * 2^32."""
    value = min(int(round(probability * _U32_SPAN)), _U32_SPAN - 1)
    return struct.unpack("<i", struct.pack("<I", value))[0]


# Opcodes used below (class | op | source).
_CALL, _EXIT = 0x85, 0x95
_MOV64_IMM, _MOV64_REG, _ADD64_IMM = 0xB7, 0xBF, 0x07
_ST_W, _LDX_W, _LD_IMM64 = 0x62, 0x61, 0x18
_JEQ_IMM, _JA = 0x15, 0x05
_JLT32_IMM, _JGE32_IMM, _JNE32_IMM = 0xA6, 0x36, 0x56


def _verdicts(drop: int) -> bytes:
    """The shared tail: pass (offset 0, two insns), then drop (offset 2, two insns)."""
    return b"".join([_insn(_MOV64_IMM, _R0, imm=TC_ACT_UNSPEC), _insn(_EXIT),
                     _insn(_MOV64_IMM, _R0, imm=drop), _insn(_EXIT)])


def independent_program(loss: float, drop: int = TC_ACT_SHOT) -> bytes:
    """Drop each packet with probability `loss` (1.0: every packet), by the `drop` verdict."""
    if loss >= 1.0:
        return b"".join([_insn(_MOV64_IMM, _R0, imm=drop), _insn(_EXIT)])
    return b"".join([
        _insn(_CALL, imm=_HELPER_PRANDOM_U32),
        _insn(_JLT32_IMM, _R0, off=2, imm=_threshold(loss)),   # rand < loss: to drop
    ]) + _verdicts(drop)


def chain_program(chain: DropChain, map_fd: int, drop: int = TC_ACT_SHOT) -> bytes:
    """The Gilbert chain over a one-entry array map holding the state (0 good, 1 bad)."""
    body = [
        _insn(_ST_W, _R10, off=-4, imm=0),                     # key = 0 on the stack
        _insn(_MOV64_REG, _R2, _R10),
        _insn(_ADD64_IMM, _R2, imm=-4),
        _insn(_LD_IMM64, _R1, BPF_PSEUDO_MAP_FD, imm=map_fd), _insn(0),
        _insn(_CALL, imm=_HELPER_MAP_LOOKUP),
        _insn(_JEQ_IMM, _R0, off=9, imm=0),                    # no state: pass
        _insn(_MOV64_REG, _R6, _R0),
        _insn(_CALL, imm=_HELPER_PRANDOM_U32),
        _insn(_LDX_W, _R7, _R6),
        _insn(_JNE32_IMM, _R7, off=3, imm=0),                  # in bad state: to "bad"
        _insn(_JGE32_IMM, _R0, off=4, imm=_threshold(chain.enter)),  # good, stays: pass
        _insn(_ST_W, _R6, imm=1),                              # good -> bad: drop
        _insn(_JA, off=4),
        _insn(_JGE32_IMM, _R0, off=3, imm=_threshold(chain.leave)),  # bad, stays: drop
        _insn(_ST_W, _R6, imm=0),                              # bad -> good: pass
    ]
    return b"".join(body) + _verdicts(drop)


def _syscall(cmd: int, attr: bytes, what: str, log: ctypes.Array | None = None) -> int:
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise InjectionError(f"{what}: bpf(2) syscall number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
    fd = _libc.syscall(number, cmd, buf, 128)
    if fd < 0:
        code = ctypes.get_errno()
        detail = f"; verifier: {log.value.decode(errors='replace').strip()}" if log is not None and log.value else ""
        raise InjectionError(f"{what}: {os.strerror(code)}{detail}", code)
    return fd


def _load(code: bytes, name: str) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    # union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level,
    # log_size, log_buf, kern_version, prog_flags, prog_name[16]
    attr = struct.pack("<IIQQIIQII16s", BPF_PROG_TYPE_SCHED_CLS, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(license_), 1, len(log),
                       ctypes.addressof(log), 0, 0, name.encode()[:15])
    return _syscall(BPF_PROG_LOAD, attr, f"load bpf program {name}", log)


def load_drop_program(chain: DropChain, name: str, drop: int = TC_ACT_SHOT) -> int:
    """Load the program for `chain` dropping by `drop`; returns its fd (the caller closes it
    once attached)."""
    if chain.independent:
        return _load(independent_program(chain.loss, drop), name)
    map_fd = _syscall(BPF_MAP_CREATE, struct.pack("<IIII", BPF_MAP_TYPE_ARRAY, 4, 4, 1),
                      f"create state map for {name}")
    try:
        return _load(chain_program(chain, map_fd, drop), name)
    finally:
        os.close(map_fd)  # the loaded program holds its own reference
