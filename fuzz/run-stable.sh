#!/bin/sh
# Builds the fuzz targets with libFuzzer on stable Rust (no cargo-fuzz, no nightly: the coverage
# instrumentation is stable codegen, the sanitizers are not used) and runs each for a bounded time,
# starting from the committed seeds. A crash, a leak of a panic, or a timeout fails the run and
# leaves the input under fuzz/artifacts/<target>/.
#
#   fuzz/run-stable.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 60 seconds each, every target.
set -eu
cd "$(dirname "$0")"
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-page_reader hypercall_dispatch hal_request index runtime_tree}
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$PWD/target"
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
    cargo build --release --target "$triple" --bins
for t in $targets; do
    mkdir -p "corpus/$t" "artifacts/$t"
    [ -d "seeds/$t" ] && cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
    echo "== $t: $seconds s"
    "target/$triple/release/$t" "corpus/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=8192 -print_final_stats=1 -artifact_prefix="artifacts/$t/"
done
