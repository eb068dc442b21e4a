export LD_LIBRARY_PATH=$PWD/.prebuilt/lib FLASHCUTE_LIBRARY=$PWD/.prebuilt/lib/libflashcute.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
T=.prebuilt/tests/cpp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$T/test_gpu_kernels --gtest_brief=1 --gtest_filter='GpuKernelsPaged*' 2>&1 | tail -2
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $T/test_gpu_kernels --gtest_filter='GpuKernelsPaged*' > $OUT/mc_paged.txt 2>&1; echo "memcheck paged rc=$? $(grep 'ERROR SUMMARY' $OUT/mc_paged.txt)"
timeout 150 python3 -m pytest -q -x --no-header -p no:cacheprovider tests/python/test_persistent.py > $OUT/pt_persist.txt 2>&1; tail -3 $OUT/pt_persist.txt
for tool in racecheck memcheck synccheck; do FLASHCUTE_FWD_GRID=2 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_fwd.py > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.txt | tail -1)"; done
timeout 120 python3 -m pytest -q --no-header -p no:cacheprovider tests/python/test_gpu_grid.py -k "test_forward_grid and not forced" > $OUT/pt_grid.txt 2>&1; tail -2 $OUT/pt_grid.txt
timeout 120 python3 bench/run.py --mode fwd --impl flashcute,flashcute-tiles --dtype bf16 --hdim 64,128,256 --seqlen 1k,4k,16k --causal 0,1 --target-s 0.03 --no-plots --no-ceilings --out $OUT/bench > $OUT/bench.txt 2>&1; tail -25 $OUT/bench.txt
