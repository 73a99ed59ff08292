set -u
cp -rn .deps/sysroot/usr/. /usr/ 2>/dev/null
B=build-final
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DSPARSEKV_CUDA=ON -DSPARSEKV_BUILD_TOOLS=ON -DSPARSEKV_BUILD_TESTS=ON -DSPARSEKV_GTEST_SOURCE=$PWD/.deps/googletest > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
cmake --build $B -j16 > $OUT/build2.log 2>&1 || { grep -E "error" -A3 $OUT/build2.log | head -40; }
echo "=== built ${SECONDS}s"
ctest --test-dir $B -j8 --timeout 200 -E "ScaleOut|ControlPlane" > $OUT/ctest-h200.log 2>&1; grep -E "tests passed|tests failed|\(Failed\)|Timeout" $OUT/ctest-h200.log | head -20
echo "=== ctest ${SECONDS}s"
for e in lru slru; do
  $B/bench/resolve_bench --batches 1,8,64,100 --contexts 32768 --miss_rates 0,0.2 --row_bytes 656 --eviction $e --json $OUT/resolve-$e.json > $OUT/resolve-$e.txt 2>&1; tail -4 $OUT/resolve-$e.txt
done
echo "=== bench ${SECONDS}s"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 90 $SAN --tool memcheck --error-exitcode 1 $B/src/attention/attention_test --gtest_filter='*Split*K64*' > $OUT/memcheck.log 2>&1; echo "memcheck split attention rc=$?"; tail -2 $OUT/memcheck.log
timeout 60 $SAN --tool memcheck --error-exitcode 1 $B/src/cuda_backend_test --gtest_filter='ManagerCudaTest.OverlapPaths*:CudaResolveTest.ZeroWindow' > $OUT/memcheck2.log 2>&1; echo "memcheck overlap rc=$?"; tail -2 $OUT/memcheck2.log
echo "=== done ${SECONDS}s"
