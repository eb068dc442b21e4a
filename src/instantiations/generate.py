"""Derive the config table and the kernel sources from kernels.py.

Writes into --out:
  configs.inc      every config in the list (dispatch data; host code, always compiled)
  launchers.inc    the configs compiled into this build, with their launch functions
  <name>.cu        one translation unit per compiled kernel
  sources.cmake    FLASHCUTE_SM80_SOURCES / FLASHCUTE_SM90_SOURCES for CMake
Files are rewritten only when their text changes, so a reconfigure does not rebuild every kernel.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels as K  # noqa: E402

DTYPE_ENUM = {"fp16": "FLASHCUTE_FLOAT16", "bf16": "FLASHCUTE_BFLOAT16"}
DTYPE_CPP = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
DIR_ENUM = {"fwd": "FLASHCUTE_FORWARD", "bwd": "FLASHCUTE_BACKWARD"}
# What each family's kernels use: sm90 loads by TMA (both directions, cp.async where TMA cannot serve) and its
# forward moves registers between warpgroups with setmaxnreg.
NEEDS = {"sm80": "arch::kMmaSync | arch::kCpAsync | arch::kLdmatrix",
         "sm90": "arch::kWgmma | arch::kTma | arch::kSetmaxnreg | arch::kCpAsync"}


def smem_bytes(family, direction, head_dim, block_m, block_n, warps, head_dim_v=None, v_in_regs=False):
    # Must equal sizeof(SharedStorage) of the kernel; the kernel static_asserts it.
    dv = head_dim_v or head_dim
    if direction == "fwd":
        if family == "sm90":  # K/V stages (FwdTraits::kStages), O where it fits (kOwnO), mbarriers padded to 1 KB
            def tiles_of(stages):
                return ((block_m + stages * block_n) * head_dim + stages * block_n * dv) * 2 + 1024
            tiles = tiles_of(3 if block_m == 64 and tiles_of(3) <= 227 * 1024 else 2)
            o = block_m * dv * 2
            return tiles + o if tiles + o <= 227 * 1024 else tiles
        return (block_m + 2 * block_n) * head_dim * 2
    if direction == "bwd" and family == "sm90":
        # Q and dO stages (two when the warpgroups split the head dim: block_n 64, more than one warpgroup; else
        # three), K, V, two stages of dS^T and, split, P^T (16-bit); then per Q stage its row terms (float32) and
        # mbarrier, and the key tile's mbarrier, padded to 1 KB.
        # Swapped (block_n 48 per warpgroup, FA3's and FA4's hd192 tile): two Q stages, one dO stage, one stage of
        # P and dS, both stored.
        split = block_n == 64 and warps > 4
        swap = block_n == 48 * (warps // 4)
        stages = 2 if split or swap else 3
        do_stages = 1 if swap else stages
        ds_stages = 1 if swap else 2
        rows = (stages * (2 * block_m * 4 + 8) + 16 + 1023) // 1024 * 1024
        tiles = (block_m * (stages * head_dim + do_stages * dv) + block_n * (head_dim + dv) +
                 ds_stages * (2 if split or swap else 1) * block_n * block_m)
        return tiles * 2 + rows
    if direction == "bwd":
        return K.bwd_smem_bytes(head_dim, block_m, block_n, warps, v_in_regs)
    return 0


def configs():
    out = []
    for fam, direction, dims, bm, bn, warps, ctas, prio, why in K.KERNELS:
        hd, dv = dims if isinstance(dims, tuple) else (dims, dims)  # (head_dim, head_dim_v) where V's differs
        for dt in K.DTYPES:
            vr = fam == "sm80" and direction == "bwd" and (hd, bm, bn, warps) in K.BWD_V_IN_REGS
            name = f"{fam}_{direction}_{dt}_hd{hd}{'' if dv == hd else f'v{dv}'}_m{bm}n{bn}w{warps}{'vr' if vr else ''}"
            lo, hi = K.ROW_RANGES.get((fam, direction, dims, bm, bn, warps), (None, None))
            out.append(dict(name=name, family=fam, direction=direction, dtype=dt, head_dim=hd, head_dim_v=dv,
                            block_m=bm, block_n=bn, warps=warps, ctas=ctas, prio=prio, why=why,
                            v_in_regs=vr, smem=smem_bytes(fam, direction, hd, bm, bn, warps, dv, vr),
                            min_rows=lo or 0, max_rows=hi or 0))
    return out


def selected(cfgs, subset, sm90):
    if not sm90:  # Hopper kernels compile for sm_90a alone
        cfgs = [c for c in cfgs if c["family"] != "sm90"]
    if subset == "all":
        return cfgs
    if subset == "none":
        return []
    if subset == "ci":
        return [c for c in cfgs
                if ((c["dtype"], c["head_dim"]) in K.CI_CASES and c["prio"] > 0) or c["name"] in K.CI_EXTRA]
    pattern = re.compile(subset)
    return [c for c in cfgs if pattern.search(c["name"])]


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def traits_args(c):
    """The traits' template arguments; V's head dim only where it differs (the traits default it to head_dim)."""
    dv = f', {c["head_dim_v"]}' if c["head_dim_v"] != c["head_dim"] else ""
    if c["v_in_regs"]:
        dv = ", true"  # BwdTraits' kVInRegs (the portable backward pads V to Q's head dim)
    return f'{DTYPE_CPP[c["dtype"]]}, {c["head_dim"]}, {c["block_m"]}, {c["block_n"]}, {c["warps"]}{dv}'


def kernel_source(c):
    fam = c["family"]
    hdr = f'{fam}/{c["direction"]}_launch.cuh'
    fn = {"fwd": "run_fwd", "bwd": "run_bwd"}[c["direction"]]
    traits = {"fwd": "FwdTraits", "bwd": "BwdTraits"}[c["direction"]]
    return (f'// Generated by src/instantiations/generate.py from kernels.py. Do not edit.\n'
            f'#include "{hdr}"\n\n'
            f'namespace flashcute::{fam} {{\n'
            f'template int {fn}<{traits}<{traits_args(c)}>>({"Fwd" if c["direction"] == "fwd" else "Bwd"}'
            f'KernelParams const&, void*);\n'
            f'}}  // namespace flashcute::{fam}\n')


def launcher_expr(c):
    fn = {"fwd": "run_fwd", "bwd": "run_bwd"}[c["direction"]]
    traits = {"fwd": "FwdTraits", "bwd": "BwdTraits"}[c["direction"]]
    fam = c["family"]
    return f'&{fam}::{fn}<{fam}::{traits}<{traits_args(c)}>>'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--subset", default="all", help="all | ci | none | a regex on kernel names")
    ap.add_argument("--sm90", type=int, default=1, help="1 when the build targets sm_90a (Hopper family)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    cfgs = configs()
    built = selected(cfgs, args.subset, args.sm90)

    rows = []
    for c in cfgs:
        rows.append(f'    {{"{c["name"]}", Family::k{c["family"].capitalize()}, {DIR_ENUM[c["direction"]]}, '
                    f'{DTYPE_ENUM[c["dtype"]]}, {c["head_dim"]}, {c["head_dim_v"]}, {c["block_m"]}, {c["block_n"]}, '
                    f'{c["warps"]}, '
                    f'{c["ctas"]}, {c["smem"]}, {NEEDS[c["family"]]}, {c["prio"]}, {c["min_rows"]}, '
                    f'{c["max_rows"]}}},')
    write_if_changed(os.path.join(args.out, "configs.inc"),
                     "// Generated from src/instantiations/kernels.py. Do not edit.\n" + "\n".join(rows) + "\n")

    fwd = [f'    {{"{c["name"]}", {launcher_expr(c)}}},' for c in built if c["direction"] == "fwd"]
    bwd = [f'    {{"{c["name"]}", {launcher_expr(c)}}},' for c in built if c["direction"] == "bwd"]
    decl = "".join(f'#include "{f}/{d}_launch.h"\n' for f, d in (("sm80", "fwd"), ("sm80", "bwd"), ("sm90", "fwd"),
                                                                     ("sm90", "bwd")))
    text = ("// Generated from src/instantiations/kernels.py. Do not edit.\n" + decl +
            "#define FLASHCUTE_FWD_LAUNCHERS \\\n" + " \\\n".join(fwd + ["    {nullptr, nullptr}"]) + "\n" +
            "#define FLASHCUTE_BWD_LAUNCHERS \\\n" + " \\\n".join(bwd + ["    {nullptr, nullptr}"]) + "\n" +
            f'#define FLASHCUTE_KERNEL_SUBSET "{args.subset}"\n')
    write_if_changed(os.path.join(args.out, "launchers.inc"), text)

    sources = {"sm80": [], "sm90": []}
    for c in built:
        path = os.path.join(args.out, c["name"] + ".cu")
        write_if_changed(path, kernel_source(c))
        sources[c["family"]].append(path)
    write_if_changed(os.path.join(args.out, "sources.cmake"), "".join(
        f"set(FLASHCUTE_{fam.upper()}_SOURCES\n" + "".join(f'  "{s}"\n' for s in srcs) + ")\n"
        for fam, srcs in sources.items()))
    print(f"flashcute: {len(built)} of {len(cfgs)} kernel configs selected (subset '{args.subset}')")


if __name__ == "__main__":
    main()
