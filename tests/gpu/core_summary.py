#!/usr/bin/env python3
"""Where an x86-64 Linux process crashed, from its core file, without gdb (the GPU machines
have none): the signal and faulting address, each thread's instruction pointer as file+offset,
and for the crashing thread the words of its stack that point into executable file mappings
(a stack scan: candidate return addresses, innermost first; some are stale).

    core_summary.py CORE [--symbols DIR] [--scan WORDS]

With --symbols, files whose base name is in DIR (unstripped builds, e.g. libgpuprof_inject.so)
are symbolized with addr2line; other libraries get the nearest exported symbol from `nm -D`
when nm is there. Reads only the core's notes, program headers and the stack's bytes.
"""
import argparse
import bisect
import os
import shutil
import struct
import subprocess
import sys

NT_PRSTATUS, NT_SIGINFO, NT_FILE = 1, 0x53494749, 0x46494C45
PF_X = 1
# user_regs_struct order (x86-64).
REGS = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
        "fs_base gs_base ds es fs gs").split()
SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}


def read_core(path):
    f = open(path, "rb")
    ident = f.read(64)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or struct.unpack_from("<H", ident, 16)[0] != 4:
        sys.exit(f"{path}: not a 64-bit ELF core file")
    phoff, = struct.unpack_from("<Q", ident, 32)
    phentsize, phnum = struct.unpack_from("<HH", ident, 54)
    loads, notes = [], []
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = struct.unpack("<IIQQQQQQ", f.read(56))
        if p_type == 1:
            loads.append((p_vaddr, p_vaddr + p_memsz, p_offset, p_filesz, p_flags))
        elif p_type == 4:
            f.seek(p_offset)
            notes.append(f.read(p_filesz))
    return f, loads, notes


def parse_notes(blobs):
    threads, siginfo, files = [], None, []
    for blob in blobs:
        off = 0
        while off + 12 <= len(blob):
            namesz, descsz, ntype = struct.unpack_from("<III", blob, off)
            off += 12 + ((namesz + 3) & ~3)
            desc = blob[off:off + descsz]
            off += (descsz + 3) & ~3
            if ntype == NT_PRSTATUS and len(desc) >= 112 + 27 * 8:
                cursig, = struct.unpack_from("<H", desc, 12)
                pid, = struct.unpack_from("<I", desc, 32)
                regs = dict(zip(REGS, struct.unpack_from("<27Q", desc, 112)))
                threads.append((pid, cursig, regs))
            elif ntype == NT_SIGINFO and len(desc) >= 24:
                signo, errno, code = struct.unpack_from("<iii", desc, 0)
                addr, = struct.unpack_from("<Q", desc, 16)
                siginfo = (signo, code, addr)
            elif ntype == NT_FILE and len(desc) >= 16:
                count, page = struct.unpack_from("<QQ", desc, 0)
                ranges = [struct.unpack_from("<QQQ", desc, 16 + 24 * i) for i in range(count)]
                names = desc[16 + 24 * count:].split(b"\0")
                for (start, end, pgoff), name in zip(ranges, names):
                    files.append((start, end, pgoff * page, name.decode(errors="replace")))
    return threads, siginfo, sorted(files)


class Where:
    def __init__(self, files, loads, symbols):
        self.files = files
        self.starts = [f[0] for f in files]
        # A file's load base: the start of its mapping at file offset 0.
        self.base = {}
        for start, _, off, name in files:
            if off == 0:
                self.base.setdefault(name, start)
        self.exec_ranges = sorted((a, b) for a, b, _, _, flags in loads if flags & PF_X)
        self.symbols = symbols
        self.nm_cache = {}

    def file_of(self, addr):
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and self.files[i][0] <= addr < self.files[i][1]:
            return self.files[i]
        return None

    def executable(self, addr):
        i = bisect.bisect_right(self.exec_ranges, (addr, float("inf"))) - 1
        return i >= 0 and self.exec_ranges[i][0] <= addr < self.exec_ranges[i][1]

    def describe(self, addr):
        f = self.file_of(addr)
        if not f:
            return f"{addr:#x} (no file)"
        name = f[3]
        rel = addr - self.base.get(name, f[0] - f[2])
        return f"{os.path.basename(name)}+{rel:#x}{self.symbolize(name, rel)}"

    def symbolize(self, name, rel):
        base = os.path.basename(name)
        if self.symbols and os.path.exists(os.path.join(self.symbols, base)) and shutil.which("addr2line"):
            r = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", os.path.join(self.symbols, base), hex(rel)],
                               capture_output=True, text=True)
            lines = [x for x in r.stdout.splitlines() if x.strip()]
            if lines:
                return " " + " <- ".join(f"{lines[i]} ({lines[i + 1]})" for i in range(0, len(lines) - 1, 2))
        syms = self.nm(name)
        if syms:
            i = bisect.bisect_right(syms, (rel, "\uffff")) - 1
            if i >= 0:
                return f" <{syms[i][1]}+{rel - syms[i][0]:#x}?>"
        return ""

    def nm(self, name):
        if name not in self.nm_cache:
            syms = []
            if shutil.which("nm") and os.path.exists(name):
                r = subprocess.run(["nm", "-D", "--defined-only", "-C", name], capture_output=True, text=True)
                for line in r.stdout.splitlines():
                    parts = line.split(maxsplit=2)
                    if len(parts) == 3 and parts[1] in "TtWw":
                        syms.append((int(parts[0], 16), parts[2]))
            self.nm_cache[name] = sorted(syms)
        return self.nm_cache[name]


def read_mem(f, loads, addr, size):
    for start, end, offset, filesz, _ in loads:
        if start <= addr < start + filesz:
            n = min(size, start + filesz - addr)
            f.seek(offset + addr - start)
            return f.read(n)
    return b""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("core")
    ap.add_argument("--symbols")
    ap.add_argument("--scan", type=int, default=4096, help="stack words to scan")
    a = ap.parse_args()
    f, loads, blobs = read_core(a.core)
    threads, siginfo, files = parse_notes(blobs)
    w = Where(files, loads, a.symbols)
    if siginfo:
        signo, code, addr = siginfo
        print(f"signal {SIGNALS.get(signo, signo)} (code {code}) at address {addr:#x}")
    if not threads:
        sys.exit("no thread in the core")
    # The kernel writes the thread that took the signal first.
    for i, (tid, cursig, regs) in enumerate(threads):
        mark = " <- crashed" if i == 0 else ""
        print(f"thread {tid}: rip {w.describe(regs['rip'])}{mark}")
    tid, _, regs = threads[0]
    print(f"crashed thread {tid}: rsp {regs['rsp']:#x} rbp {regs['rbp']:#x}; "
          f"rdi {regs['rdi']:#x} rsi {regs['rsi']:#x} rdx {regs['rdx']:#x} rax {regs['rax']:#x}")
    stack = read_mem(f, loads, regs["rsp"], a.scan * 8)
    print(f"stack scan of the crashed thread ({len(stack) // 8} words): code addresses found")
    shown = 0
    for i in range(len(stack) // 8):
        v, = struct.unpack_from("<Q", stack, i * 8)
        if w.executable(v) and w.file_of(v):
            print(f"  rsp+{i * 8:#06x}: {w.describe(v)}")
            shown += 1
            if shown >= 40:
                break


if __name__ == "__main__":
    main()
