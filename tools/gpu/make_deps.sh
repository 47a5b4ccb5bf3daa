#!/usr/bin/env bash
# Builds .gpudeps/usr: a relocatable copy of the build dependencies the GPU image lacks (PCRE2 dev files, GoogleTest +
# its CMake config, CLI11 headers, and the runtime libraries of the server module), taken from this (Ubuntu x86-64) machine's system packages. Run once here, then run
# tools/gpu/check.sh on the GPU machine with carry [".gpudeps"]. The folder is ignored via .git/info/exclude.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
grep -qx "/.gpudeps/" .git/info/exclude 2>/dev/null || echo "/.gpudeps/" >> .git/info/exclude
L=/usr/lib/x86_64-linux-gnu
D=.gpudeps/usr
rm -rf .gpudeps
mkdir -p $D/include $D/lib/x86_64-linux-gnu/pkgconfig $D/lib/x86_64-linux-gnu/cmake
cp -r /usr/include/CLI /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h $D/include/
cp -a $L/libpcre2-8.so* $L/libgtest*.a $L/libgmock*.a $D/lib/x86_64-linux-gnu/
# Runtime libraries of the dsv4 binary's HTTP server module (for PREBUILT runs of check.sh; harmless otherwise).
for lib in libcpp-httplib.so libbrotlidec.so libbrotlienc.so libbrotlicommon.so libssl.so.3 libcrypto.so.3; do
  cp -a $L/$lib* $D/lib/x86_64-linux-gnu/ 2>/dev/null || true
done
cp -r $L/cmake/GTest $D/lib/x86_64-linux-gnu/cmake/
# Build-time pieces of the server module: httplib's header and .pc, and the headers/.pc files its Cflags and
# Requires.private pull in (OpenSSL, zlib, brotli), since the GPU image has none of them.
cp /usr/include/httplib.h /usr/include/zlib.h /usr/include/zconf.h $D/include/
cp -r /usr/include/openssl /usr/include/brotli $D/include/
mkdir -p $D/include/x86_64-linux-gnu && cp -r /usr/include/x86_64-linux-gnu/openssl $D/include/x86_64-linux-gnu/
cp -a $L/libz.so* $D/lib/x86_64-linux-gnu/ 2>/dev/null || true
for pc in libpcre2-8 cpp-httplib openssl libssl libcrypto zlib libbrotlicommon libbrotlidec libbrotlienc; do
  sed -e 's|^prefix=/usr|prefix=${pcfiledir}/../../..|' -e 's|^includedir=/usr/include|includedir=${prefix}/include|' \
      -e 's|^libdir=/usr/lib/x86_64-linux-gnu|libdir=${prefix}/lib/x86_64-linux-gnu|' \
      $L/pkgconfig/$pc.pc > $D/lib/x86_64-linux-gnu/pkgconfig/$pc.pc
done
du -sh .gpudeps
