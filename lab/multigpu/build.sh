#!/bin/bash
# build.sh: on the CPU machine (it has Go), the binaries lab/multigpu/run.sh carries to a GPU
# machine without Go: qual, qual-server, the Ginkgo CLI pinned by go.mod, and one precompiled
# suite per family (go test -c), stripped and packed as bin/multigpu.tgz (xz; carry it).
#   bash lab/multigpu/build.sh            # families: $MG_FAMILIES, default "gpt2 qwen qwen3vl zimage"
set -euo pipefail
cd "$(dirname "$0")/../.."
D=bin/multigpu
rm -rf "$D" && mkdir -p "$D"
FLAGS=(-trimpath -ldflags='-s -w')
nice go build "${FLAGS[@]}" -o "$D/" ./qual/cmd/qual ./server/cmd/qual-server
nice go build "${FLAGS[@]}" -o "$D/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
for fam in ${MG_FAMILIES:-gpt2 qwen qwen3vl zimage}; do
  nice go test -c "${FLAGS[@]}" -o "$D/$fam.test" "./families/$fam"
done
# xz -9's 64 MiB window reaches the previous suite binary, which shares most of its code: four
# suites pack to little more than one (the carry limit is 64 MiB).
(cd "$D" && XZ_OPT=-9 tar -cJf ../multigpu.tgz qual qual-server ginkgo *.test)
ls -l bin/multigpu.tgz
