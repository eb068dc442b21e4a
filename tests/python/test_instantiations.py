"""CPU tests of the instantiation list and its generator (src/instantiations/): what a build compiles per arch
target, and which configs the dispatch table lists."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATE = os.path.join(ROOT, "src", "instantiations", "generate.py")
sys.path.insert(0, os.path.join(ROOT, "src", "instantiations"))
import kernels  # noqa: E402


def generate(tmp_path, subset, sm90):
    out = tmp_path / f"{subset}_{sm90}"
    subprocess.run([sys.executable, GENERATE, "--out", str(out), "--subset", subset, "--sm90", str(sm90)],
                   check=True, capture_output=True)
    launchers = (out / "launchers.inc").read_text()
    configs = (out / "configs.inc").read_text()
    sources = (out / "sources.cmake").read_text()
    return launchers, configs, sources


def test_hopper_kernels_only_when_sm90a_is_a_target(tmp_path):
    with_90, table, sources_90 = generate(tmp_path, "all", 1)
    without_90, table_again, sources = generate(tmp_path, "all", 0)
    assert re.search(r'"sm90_fwd_\w+", &sm90::run_fwd', with_90)
    assert re.search(r'"sm90_bwd_\w+", &sm90::run_bwd', with_90)
    assert "sm90::" not in without_90 and "sm90_" not in sources
    assert re.search(r"FLASHCUTE_SM90_SOURCES\n\s+\S+sm90_fwd", sources_90)
    # The dispatch table lists every config either way: a build without sm_90a falls back at run time.
    assert table == table_again and "Family::kSm90" in table


def test_hopper_configs_need_wgmma_and_no_other_family_does(tmp_path):
    _, table, _ = generate(tmp_path, "none", 1)
    for line in table.splitlines():
        if "Family::kSm90" in line:
            assert "arch::kWgmma" in line
        elif "Family::kSm80" in line:
            assert "arch::kWgmma" not in line and "arch::kMmaSync" in line


def test_ci_subset_covers_every_family_and_direction(tmp_path):
    launchers, _, _ = generate(tmp_path, "ci", 1)
    names = set(re.findall(r'"(sm\d+_(?:fwd|bwd)_\w+)"', launchers))
    assert {n.split("_")[0] + "_" + n.split("_")[1] for n in names} == {"sm80_fwd", "sm80_bwd", "sm90_fwd", "sm90_bwd"}
    assert set(kernels.CI_EXTRA) <= names  # the V-in-registers backward too


def test_every_forward_head_dim_has_a_hopper_and_a_portable_config():
    fwd = [k for k in kernels.KERNELS if k[1] == "fwd"]
    for hd in (64, 96, 128, 192, 256):
        assert any(k[0] == "sm90" and k[2] == hd for k in fwd), hd
        assert any(k[0] == "sm80" and k[2] == hd for k in fwd), hd


def test_v_in_registers_tiles_are_named_apart_and_fit_99_kb(tmp_path):
    bwd = {(k[2], k[3], k[4], k[5]) for k in kernels.KERNELS if k[0] == "sm80" and k[1] == "bwd"}
    assert kernels.BWD_V_IN_REGS and kernels.BWD_V_IN_REGS <= bwd
    for tile in kernels.BWD_V_IN_REGS:
        assert kernels.bwd_smem_bytes(*tile, v_in_regs=True) <= 101376
    # P and dS in V's bytes are what brings hd256's 64 x 32 under the 99 KB class.
    assert kernels.bwd_smem_bytes(256, 64, 32, 8) > 101376
    _, table, _ = generate(tmp_path, "none", 0)
    assert '"sm80_bwd_bf16_hd256_m64n32w8vr", Family::kSm80, FLASHCUTE_BACKWARD, FLASHCUTE_BFLOAT16, 256, 256, ' \
           '64, 32, 8, 1, 98816,' in table
    sys.path.insert(0, os.path.dirname(GENERATE))
    import generate as gen
    args = {c["name"]: gen.traits_args(c) for c in gen.configs()}
    assert args["sm80_bwd_fp16_hd256_m64n32w8vr"] == "cutlass::half_t, 256, 64, 32, 8, true"
    assert args["sm80_bwd_fp16_hd256_m64n64w8"] == "cutlass::half_t, 256, 64, 64, 8"
