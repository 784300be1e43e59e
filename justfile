# kshard tasks (optional: `cargo install just`). The README's two commands need no just.

# Start kshard with the embedded store in ./kshard-data.
serve *ARGS:
    cargo run --release -- serve {{ARGS}}

# The whole test suite, with the style checks CI runs first.
test:
    bash .ci/run

# Benchmarks through the HTTP API (numbers, and a plot in target/bench/).
bench:
    cargo bench --bench api

# kshard against etcd (installs Debian's etcd-server if missing): ratios, memory, fan-out.
bench-etcd:
    cargo bench --bench etcd
