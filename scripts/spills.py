"""Where each kernel's spills sit, read from its machine code (no GPU needed).

ptxas says how many bytes a kernel spills; this says where: for every kernel in a library or cubin, its registers
and stack (cuobjdump -res-usage), and its local-memory loads and stores (LDL / STL) counted by the register budget in
force at that point (the code after a warpgroup's `setmaxnreg` raise or lower: Hopper consumers and producers) and
by loop depth (how many loops of the control-flow graph enclose the instruction: 0 runs once per CTA; a persistent
tile loop, a mainloop, a wait's retry loop each add one).

    python3 scripts/spills.py build/sm90a/lib/libflashcute.so [--filter REGEX] [--all]

cuobjdump comes from $CUOBJDUMP, the PATH, $CUDA_HOME/bin, or the one triton's wheel carries.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

_FUNC = re.compile(r"Function : (\S+)")
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRA = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:`?\(?)(0x[0-9a-f]+)")
_RES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+)")
_ENDS = ("BRA", "EXIT", "RET", "BRX", "JMX")  # opcodes after which a basic block ends


def find_cuobjdump():
    for cand in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")):
        if cand and os.path.isfile(cand):
            return cand
    try:
        import triton  # its wheel carries a recent cuobjdump
        cand = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return cand if os.path.isfile(cand) else None
    except ImportError:
        return None


def parse_sass(text):
    """{kernel: [(address, instruction text)]} from `cuobjdump -sass` output."""
    kernels, cur = {}, None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = _INSN.search(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2).strip()))
    return kernels


def _opcode(text):
    parts = text.split()
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def _target(text, index):
    """The instruction index a branch goes to, or None (not a branch, or an address outside the kernel)."""
    m = _BRA.search(text)
    return index.get(int(m.group(1), 16)) if m else None


def loop_depths(insns):
    """Per instruction, how many natural loops of the control-flow graph contain it (a loop: a branch to a block that
    dominates it, and the code that reaches the branch without passing that block; loops sharing a header count
    once)."""
    n = len(insns)
    index = {addr: i for i, (addr, _) in enumerate(insns)}
    starts = {0}
    for i, (_, text) in enumerate(insns):
        t = _target(text, index)
        if t is not None:
            starts.add(t)
        if _opcode(text).split(".")[0] in _ENDS and i + 1 < n:
            starts.add(i + 1)
    starts = sorted(starts)
    ends = starts[1:] + [n]  # block b covers instructions [starts[b], ends[b])
    block_of = [0] * n
    for b, (lo, hi) in enumerate(zip(starts, ends)):
        for i in range(lo, hi):
            block_of[i] = b
    preds = [set() for _ in starts]
    branches = []  # (block, target block) of every branch; the back edges among them are found below
    for b, hi in enumerate(ends):
        text = insns[hi - 1][1]
        t = _target(text, index)
        if t is not None:
            preds[block_of[t]].add(b)
            branches.append((b, block_of[t]))
        stops = _opcode(text).split(".")[0] in _ENDS and not text.startswith("@")  # no fall-through
        if not stops and b + 1 < len(starts):
            preds[b + 1].add(b)
    # Back edges are those whose target dominates their source (Cooper, Harvey and Kennedy's iteration): a wait's
    # out-of-line retry block branches to an earlier address without closing a loop.
    order, seen, succs = [], set(), [set() for _ in starts]
    for b, ps in enumerate(preds):
        for p in ps:
            succs[p].add(b)
    stack = [(0, iter(sorted(succs[0])))]
    seen.add(0)
    while stack:
        node, it = stack[-1]
        nxt = next((c for c in it if c not in seen), None)
        if nxt is None:
            order.append(node)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(sorted(succs[nxt]))))
    rpo = order[::-1]
    pos = {b: i for i, b in enumerate(rpo)}
    idom = {0: 0}

    def meet(a, b):
        while a != b:
            while pos[a] > pos[b]:
                a = idom[a]
            while pos[b] > pos[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            done = [p for p in preds[b] if p in idom]
            if not done:
                continue
            new = done[0]
            for p in done[1:]:
                new = meet(p, new)
            if idom.get(b) != new:
                idom[b], changed = new, True

    def dominates(h, b):
        while b in idom:
            if b == h:
                return True
            if b == idom[b]:
                return False
            b = idom[b]
        return False

    bodies = {}
    for src, head in branches:
        if not dominates(head, src):
            continue
        body = bodies.setdefault(head, {head})
        stack = [src]
        while stack:
            x = stack.pop()
            if x not in body:
                body.add(x)
                stack.extend(preds[x])
    depth = [0] * len(starts)
    for body in bodies.values():
        for b in body:
            depth[b] += 1
    return [depth[block_of[i]] for i in range(n)]


def spill_sites(insns):
    """Counter of (budget, loop depth, 'LDL' | 'STL') over a kernel's local-memory accesses. budget: 'raised' or
    'lowered' after the latest setmaxnreg above the instruction, else 'launch'."""
    depths = loop_depths(insns)
    sites, budget = Counter(), "launch"
    for i, (_, text) in enumerate(insns):
        op = _opcode(text)
        if op.startswith("USETMAXREG") or op.startswith("SETMAXREG"):
            budget = "lowered" if ".DEALLOC" in op else "raised"
        base = op.split(".")[0]
        if base in ("LDL", "STL"):
            sites[(budget, depths[i], base)] += 1
    return sites


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def short(name):
    name = re.sub(r"flashcute::|cutlass::|cute::", "", name)
    return re.sub(r"\((sm90::)?(Fwd|Bwd)(Kernel)?Params.*", "", name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="libflashcute.so or .cubin files")
    ap.add_argument("--filter", default="", help="regex on the demangled kernel name")
    ap.add_argument("--all", action="store_true", help="also list kernels without local-memory accesses")
    args = ap.parse_args()
    tool = find_cuobjdump()
    if not tool:
        sys.exit("spills.py: no cuobjdump (set CUOBJDUMP, or install the CUDA toolkit or triton)")
    for path in args.files:
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
        res = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
        usage = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _RES.finditer(res)}
        kernels = parse_sass(sass)
        names = list(kernels)
        print(f"# {path}: {len(names)} kernels; LDL/STL counts by register budget (launch, or after setmaxnreg "
              "raised / lowered it) and loop depth dN")
        for raw, nice in sorted(zip(names, demangle(names)), key=lambda p: short(p[1])):
            if args.filter and not re.search(args.filter, nice):
                continue
            sites = spill_sites(kernels[raw])
            if not sites and not args.all:
                continue
            regs, stack = usage.get(raw, (0, 0))
            parts = []
            for budget in ("launch", "raised", "lowered"):
                here = {k: v for k, v in sites.items() if k[0] == budget}
                if here:
                    cells = " ".join(f"d{d}:{here.get((budget, d, 'LDL'), 0)}/{here.get((budget, d, 'STL'), 0)}"
                                     for d in sorted({k[1] for k in here}))
                    parts.append(f"{budget} {cells}")
            print(f"{short(nice)}\n    regs {regs} stack {stack} B; LDL/STL {'; '.join(parts) or 'none'}")


if __name__ == "__main__":
    main()
