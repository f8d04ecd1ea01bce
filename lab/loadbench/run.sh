cd .gpu/pacing && mkdir -p /tmp/b && tar xJf bin.tar.xz -C /tmp/b && tar xJf cache.tar.xz -C /tmp && export MODELQUAL_CACHE=/tmp/cache MODELQUAL_BIN=/tmp/b GOMAXPROCS=2 HOME=/tmp
(nproc; uname -a; taskset -pc $$; cat /proc/cpuinfo | grep -m1 'model name') > $OUT/env.txt 2>&1
T="taskset -c 0,1"
B="-test.run ^$ -test.benchtime 1x"
$T /tmp/b/load.test $B -test.bench 'ClientStreamingC32|NonStreamingRate|OpenLoopLateness' -test.count 3 2>&1 | tee $OUT/new.txt
$T /tmp/b/load.test $B -test.bench 'LowRateDistortion' -test.count 1 2>&1 | tee $OUT/lowrate-new.txt
$T /tmp/b/load-main.test $B -test.bench 'ClientStreamingC32|NonStreamingRate|OpenLoopLateness|LowRateDistortion' -test.count 1 2>&1 | tee $OUT/main.txt
