#!/usr/bin/env bash
# Offline kit: the Debian-provided headers, CMake/pkg-config files and shared libraries that
# k3serve builds and runs against, packed into one relocatable tarball for an air-gapped GPU host
# that has only the CUDA toolkit, a C++ compiler, CMake and NCCL (e.g. inside PyTorch).
#
#   deploy/offline-kit.sh pack   [OUT_DIR]         (default .kit/; run on the Debian 12 build machine)
#   deploy/offline-kit.sh unpack TARBALL DEST      (on the GPU host; writes DEST/env.sh)
#   source DEST/env.sh                             (CMAKE_PREFIX_PATH, PKG_CONFIG_PATH, PATH,
#                                                   LD_LIBRARY_PATH, NCCL_ROOT when found)
#
# UCX is not a Debian package here: the kit carries the UCX 1.22 tree of the libucx-cu13 wheel that
# tools/install-deps.sh put into the build venv (K3_BUILD_DIR, default build/), under k3-kit/ucx/.
#
# Boost (header-only, for k3-router's HTTP server) travels as a closure: only the headers that the
# router's sources actually include (the compiler's -M dependency list), boost/config whole (its
# compiler and library selection differs between compilers) and Boost's CMake package files, ~7 MB
# unpacked instead of the package's ~180 MB. See deploy/OFFLINE_KIT.md.
set -euo pipefail

ARCH_LIB=/usr/lib/x86_64-linux-gnu
# Packages whose files we take (headers, .so, CMake configs, .pc). Runtime dependencies of the
# shared libraries are added afterwards by following ldd.
PACKAGES=(
  nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 catch2 libcli11-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread
  libzmq3-dev libzmq5 cppzmq-dev
  pkgconf pkgconf-bin libpkgconf3
)
# Provided by every Linux host with a compiler; never packed.
BASE_LIBS='^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s|libresolv|libutil)\.so'

die() { echo "offline-kit: $*" >&2; exit 1; }

# The wheel's UCX: headers, CMake config, shared libraries and transport modules (cuda, cma), the
# wheel's own cudart/libgomp that the modules and ucx_perftest load by RPATH, ucx_perftest and ucx_info.
# Static archives are left out (~55 MB; we link the shared libraries).
pack_ucx() {
  local dest=$1 root
  local build=${K3_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build}
  root=$(compgen -G "$build/venv/lib/python3*/site-packages/libucx" | head -n1)
  [[ -f "$root/lib/cmake/ucx/ucx-config.cmake" ]] || die "no UCX wheel in $build/venv (run tools/install-deps.sh)"
  mkdir -p "$dest/libucx/lib/ucx" "$dest/libucx/bin" "$dest/libucx/lib/cmake"
  cp -a "$root/include" "$root/etc" "$dest/libucx/"
  cp -a "$root/lib/cmake/ucx" "$dest/libucx/lib/cmake/"
  # The wheel holds each library three times (.so, .so.0, .so.0.0.0; wheels have no symlinks): one
  # file, two links.
  local f base
  for f in "$root"/lib/*.so.0.0.0 "$root"/lib/ucx/*.so.0.0.0; do
    base=${f#"$root"/lib/}
    cp "$f" "$dest/libucx/lib/$base"
    ln -s "$(basename "$base")" "$dest/libucx/lib/${base%.0.0}"
    ln -s "$(basename "$base")" "$dest/libucx/lib/${base%.0.0.0}"
  done
  cp -a "$root/bin/ucx_perftest" "$root/bin/ucx_info" "$dest/libucx/bin/"
  cp -a "$root/../libucx_cu13.libs" "$dest/"
}

# The Boost headers k3-router compiles against, copied under $1 at their /usr paths.
boost_closure() {
  local root=$1 repo list
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  dpkg -s libboost1.74-dev >/dev/null 2>&1 || die "package libboost1.74-dev is not installed here (tools/install-deps.sh)"
  list=$(mktemp)
  local src
  while IFS= read -r src; do
    # -MG: a header missing here (e.g. CUDA) is listed, not fatal; only /usr/include/boost entries are kept.
    "${CXX:-c++}" -std=c++20 -DBOOST_ALL_NO_LIB -I"$repo" -M -MG "$src" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' >> "$list" ||
      die "no Boost header found in the dependencies of $src"
  done < <(grep -rl --include='*.cpp' --include='*.h' '#include <boost/' "$repo/router")
  find /usr/include/boost/config -type f >> "$list"
  find /usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0 /usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.74.0 \
    -type f >> "$list"
  local f
  while IFS= read -r f; do
    f=$(realpath -s "$f")
    mkdir -p "$root$(dirname "$f")"
    cp -a "$f" "$root$f"
  done < <(sort -u "$list")
  echo "offline-kit: $(sort -u "$list" | wc -l) Boost files (the headers k3-router includes, boost/config, CMake files)"
  rm -f "$list"
}

pack() {
  local out=${1:-.kit}
  command -v dpkg >/dev/null || die "pack needs dpkg (run it on the Debian 12 build machine)"
  STAGE=$(mktemp -d)
  trap 'rm -rf "$STAGE"' EXIT
  local stage=$STAGE
  local root=$stage/k3-kit
  mkdir -p "$root"
  local pkgs=("${PACKAGES[@]}")
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || die "package $p is not installed here (tools/install-deps.sh)"
    while IFS= read -r f; do
      [[ -f "$f" || -L "$f" ]] || continue
      case "$f" in
        /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*|*/openblas-pthread/*.a) continue ;;
        */openblas-pthread/liblapack*|*/openblas-pthread/libblas*) continue ;;  # only -lopenblas is linked
        /usr/include/*|/usr/lib/*|/usr/share/cmake*|/usr/share/pkgconfig/*|/usr/bin/pkgconf|/usr/bin/pkg-config) ;;
        *) continue ;;
      esac
      mkdir -p "$root$(dirname "$f")"
      cp -a "$f" "$root$f"
    done < <(dpkg -L "$p")
  done
  boost_closure "$root"
  # Runtime closure: every non-base library the packed .so files and pkgconf load.
  local added=1
  while [[ $added == 1 ]]; do
    added=0
    while IFS= read -r lib; do
      basename "$lib" | grep -Eq "$BASE_LIBS" && continue
      # /lib is /usr/lib on merged-/usr systems: file everything under the canonical directory,
      # the one env.sh puts on LD_LIBRARY_PATH (the linker also resolves indirect deps there).
      local dst
      dst="$root$(readlink -f "$(dirname "$lib")")/$(basename "$lib")"
      [[ -e "$dst" ]] && continue
      mkdir -p "$(dirname "$dst")"
      cp -L "$lib" "$dst"
      added=1
    done < <(find "$root" \( -name '*.so*' -o -path '*/bin/pkgconf' \) -type f -exec ldd {} \; 2>/dev/null |
             awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
  done
  # Absolute symlinks (Debian alternatives) would point outside the kit: replace them by files.
  while IFS= read -r l; do
    local target
    target=$(readlink "$l")
    if [[ "$target" == /* ]]; then
      if [[ -e "$root$target" ]]; then
        ln -sfn "$(realpath --relative-to="$(dirname "$l")" "$root$target")" "$l"
      elif [[ -e "$target" ]]; then
        rm "$l" && cp -L "$target" "$l"
      else
        rm "$l"
      fi
    fi
  done < <(find "$root" -type l)
  # pkg-config files: prefix relative to the file, every other /usr path through ${prefix}.
  while IFS= read -r pc; do
    local rel
    rel=$(realpath --relative-to="$(dirname "$pc")" "$root/usr")
    grep -q '^prefix=' "$pc" || sed -i '1i prefix=/usr' "$pc"
    sed -i -E -e "/^prefix=/!s#(^|[^A-Za-z0-9_])/usr/#\1\${prefix}/#g" -e "s#^prefix=.*#prefix=\${pcfiledir}/$rel#" "$pc"
    # We link shared libraries only; private requirements name .pc files the kit does not carry.
    sed -i -E '/^Requires\.private:/d' "$pc"
  done < <(find "$root" -name '*.pc')
  # CMake package files: absolute /usr paths become paths relative to the file itself.
  while IFS= read -r cm; do
    if grep -q '"/usr/\|[ (]/usr/' "$cm"; then
      local rel
      rel=$(realpath --relative-to="$(dirname "$cm")" "$root/usr")
      sed -i -E "s#([\" (;])/usr/#\1\${CMAKE_CURRENT_LIST_DIR}/$rel/#g" "$cm"
    fi
  done < <(find "$root" -name '*.cmake')
  pack_ucx "$root/ucx"
  cat > "$root/env.sh" <<'ENV'
# Source me: points CMake, pkg-config and the loader at this kit (and at NCCL inside PyTorch).
K3_KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export K3_KIT
export CMAKE_PREFIX_PATH="$K3_KIT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$K3_KIT/usr/lib/x86_64-linux-gnu/pkgconfig:$K3_KIT/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$K3_KIT/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PATH="$K3_KIT/usr/bin:$PATH"
export LD_LIBRARY_PATH="$K3_KIT/usr/lib/x86_64-linux-gnu:$K3_KIT/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$K3_KIT/ucx/libucx:$CMAKE_PREFIX_PATH"
export PATH="$K3_KIT/ucx/libucx/bin:$PATH"
export LD_LIBRARY_PATH="$K3_KIT/ucx/libucx/lib:$LD_LIBRARY_PATH"
if _nccl=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null) && [ -f "$_nccl/include/nccl.h" ]; then
  export NCCL_ROOT="$_nccl"
  export CMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH:$_nccl"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$_nccl/lib"
  [ -e "$_nccl/lib/libnccl.so" ] || echo "k3 kit: $_nccl/lib has no libnccl.so link; link libnccl.so.2 as -l:libnccl.so.2" >&2
fi
unset _nccl
ENV
  mkdir -p "$out"
  tar -C "$stage" -czf "$out/k3-offline-kit.tar.gz" k3-kit
  echo "offline-kit: $(du -sh "$root" | cut -f1) unpacked, $(du -h "$out/k3-offline-kit.tar.gz" | cut -f1) packed -> $out/k3-offline-kit.tar.gz"
}

unpack() {
  local tarball=${1:?tarball} dest=${2:?destination}
  mkdir -p "$dest"
  tar -C "$dest" --strip-components=1 -xzf "$tarball"
  echo "offline-kit: unpacked into $dest; now: source $dest/env.sh"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  unpack) shift; unpack "$@" ;;
  *) echo "usage: $0 pack [OUT_DIR] | unpack TARBALL DEST" >&2; exit 2 ;;
esac
