set -u
PREBUILT=build-cuda PREBUILT_SRC=/work/main SKIP_SANITIZER=1 PROFILE_DECODE=1 SYNTH_TIMEOUT=200 OUT=$OUT tools/gpu/check.sh > $OUT/check.out 2>&1; echo check rc=$?
NCCL_ROOT=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
export LD_LIBRARY_PATH=$PWD/.gpudeps/usr/lib/x86_64-linux-gnu:$NCCL_ROOT/lib
DSV4_GEMV_RING=0 timeout 60 build-cuda/dsv4 bench-ops --reps 30 > $OUT/bench_v3.log 2>&1
DSV4_GEMV_RING=0 timeout 150 build-cuda/dsv4 bench --synthetic flash --layers 20 --context 8192 --prompt 2048 > $OUT/synth_v3.log 2>&1
DSV4_GPU_TESTS=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 build-cuda/test_cuda --gtest_filter='CudaOps.RingGemvShapes:CudaOps.Fp8LinearGroupedWoA:CudaOps.Mxfp4ExpertsAndRouter' > $OUT/sanitizer_ring.log 2>&1; echo sanitizer rc=$?
cat $OUT/summary.md | grep -v "^\[cuda-graph\]\|^\[cuda-mtp\]\|^\[cuda-vs-cpu\]\|^\[cuda-session\]"
grep "ring vs v3" $OUT/test_cuda.log
echo ---v3; grep -E "gemv|experts" $OUT/bench_v3.log; grep -E "per layer|tok/s" $OUT/synth_v3.log
