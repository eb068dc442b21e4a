"""scripts/spills.py's reading of SASS: loops found through dominators, so a wait's out-of-line retry block (which
branches back to an earlier address) closes no loop; spills counted by register budget and loop depth."""
import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "spills.py"
_spec = importlib.util.spec_from_file_location("spills", _path)
spills = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spills)

SASS = """
        Function : _Z6kernelv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   USETMAXREG.DEALLOC.CTAPOOL 0x18 ;
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3] ;
        /*0040*/              @!P0 BRA 0x100 ;
        /*0050*/                   LDL R4, [R1] ;
        /*0060*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0070*/                   ISETP.GE.AND P1, PT, R5, R6, PT ;
        /*0080*/              @!P1 BRA 0x30 ;
        /*0090*/                   STL [R1+0x4], R5 ;
        /*00a0*/                   EXIT ;
        /*0100*/                   SYNCS.PHASECHK.TRANS64 P0, [R3] ;
        /*0110*/              @!P0 BRA 0x100 ;
        /*0120*/                   BRA 0x50 ;
"""


def test_parse_and_depths():
    kernels = spills.parse_sass(SASS)
    insns = kernels["_Z6kernelv"]
    assert len(insns) == 14 and insns[1] == (0x10, "STL [R1], R2")
    depth = dict(zip((a for a, _ in insns), spills.loop_depths(insns)))
    assert depth[0x10] == 0 and depth[0x90] == 0        # before and after the loop
    assert depth[0x30] == 1 and depth[0x50] == 1        # the loop 0x30-0x80 (and its retry block)
    assert depth[0x100] == 2 and depth[0x120] == 1      # the retry block's own spin adds one


def test_sites_by_budget_and_depth():
    insns = spills.parse_sass(SASS)["_Z6kernelv"]
    sites = spills.spill_sites(insns)
    assert sites == {("launch", 0, "STL"): 1, ("lowered", 1, "LDL"): 1, ("lowered", 0, "STL"): 1}
