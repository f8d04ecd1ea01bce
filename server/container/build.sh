#!/usr/bin/env bash
# Builds the local image modelqual/qual-server:dev (or $IMAGE) from bin/qual-server with
# nothing pulled: FROM scratch plus the binary's shared libraries as ldd resolves them on this
# machine. `make image` runs it after `make build`. The harness's container launcher uses the
# same image.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin_dir="${MODELQUAL_BIN:-$root/bin}"
bin="$bin_dir/qual-server"
image="${IMAGE:-modelqual/qual-server:dev}"

if [[ ! -x "$bin" ]]; then
	echo "build.sh: $bin not found; run 'make build' first" >&2
	exit 1
fi
command -v docker >/dev/null || { echo "build.sh: docker is not installed" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
rootfs="$stage/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/models" "$rootfs/records"
install -m 0755 "$bin" "$rootfs/usr/local/bin/qual-server"

# copy_libs FILE: copy every shared library FILE needs, at the path the loader will look for
# it, dereferencing symlinks. A library ldd cannot find is an error: the image would not start.
copy_libs() {
	local out
	out="$(ldd "$1" 2>&1)" || { echo "build.sh: $1 is static or not an ELF file: $out" >&2; return 0; }
	if grep -q "not found" <<<"$out"; then
		echo "build.sh: $1 needs libraries this machine lacks:" >&2
		grep "not found" <<<"$out" >&2
		return 1
	fi
	# Lines look like "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)" or
	# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
	awk '/=>/ { if ($3 ~ /^\//) print $3; next } $1 ~ /^\// { print $1 }' <<<"$out" | sort -u | while read -r lib; do
		mkdir -p "$rootfs$(dirname "$lib")"
		cp -L "$lib" "$rootfs$lib"
	done
}
copy_libs "$bin"

# The CUDA backend is loaded at run time from next to the executable when present
# (native/cuda); its driver libraries come from the NVIDIA container runtime, not the image.
if [[ -f "$bin_dir/libmodelqual_cuda.so" ]]; then
	install -m 0644 "$bin_dir/libmodelqual_cuda.so" "$rootfs/usr/local/bin/libmodelqual_cuda.so"
	ldd "$bin_dir/libmodelqual_cuda.so" | awk '/=>/ && $3 ~ /^\// { print $3 }' | grep -v -e libcuda.so -e libnvidia | while read -r lib; do
		mkdir -p "$rootfs$(dirname "$lib")"
		cp -L "$lib" "$rootfs$lib"
	done
fi

# An unprivileged user (65532, as distroless "nonroot"), so the server never runs as root.
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
qual:x:65532:65532:qual-server:/nonexistent:/sbin/nologin
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
qual:x:65532:
GROUP
chmod 0755 "$rootfs/records"

cp "$root/server/container/Dockerfile" "$stage/Dockerfile"
rev="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
# BuildKit needs the buildx plugin; the classic builder builds FROM scratch just as well.
if [[ -z "${DOCKER_BUILDKIT:-}" ]]; then
	if docker buildx version >/dev/null 2>&1; then DOCKER_BUILDKIT=1; else DOCKER_BUILDKIT=0; fi
fi
DOCKER_BUILDKIT="$DOCKER_BUILDKIT" docker build --pull=false \
	--label "org.opencontainers.image.revision=$rev" \
	--label "org.opencontainers.image.title=qual-server" \
	-t "$image" "$stage"
echo "built $image"
