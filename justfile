# kshard tasks. `just serve` starts a server; `just test` runs every test.

# Start kshard with the embedded store in ./kshard-data.
serve *ARGS:
    cargo run --release -- serve {{ARGS}}

# The whole test suite (what CI runs).
test:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings
    cargo nextest run --no-fail-fast

# Benchmarks through the HTTP API (numbers and a plot in target/bench/).
bench:
    cargo bench --bench api
