set -x
cd .gpu/pacing2 && mkdir -p /tmp/b && tar xJf bin.tar.xz -C /tmp/b && tar xJf cache.tar.xz -C /tmp && export MODELQUAL_CACHE=/tmp/cache MODELQUAL_BIN=/tmp/b GOMAXPROCS=2 HOME=/tmp
(nproc; uname -a; id; taskset -pc $$; grep -m1 'model name' /proc/cpuinfo; cat /sys/kernel/debug/sched/preempt) > $OUT/env.txt 2>&1
gcc -O2 -o /tmp/cyc /tmp/b/cyc.c && (taskset -c 0,1 /tmp/cyc 1; taskset -c 0,1 /tmp/cyc) >> $OUT/env.txt 2>&1
T="taskset -c 0,1"
B="-test.run ^$ -test.benchtime 1x"

$T /tmp/b/load.test $B -test.bench 'ClientStreamingC32|NonStreamingRate|OpenLoopLateness' -test.count 3 2>&1 | tee $OUT/new.txt
$T /tmp/b/load.test $B -test.bench 'LowRateDistortion' -test.count 1 2>&1 | tee $OUT/lowrate-new.txt
