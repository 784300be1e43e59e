//! The `kshard` command line.

use anyhow::Context;
use clap::{Parser, Subcommand};

/// mimalloc rather than glibc's malloc: allocation and free were a sixth of
/// a create's CPU under glibc, and its per-thread arenas held freed memory
/// that the server's resident size then reported as its own.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "kshard",
    version,
    about = "A Kubernetes API server shard for CRD-defined resource groups"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API.
    Serve(Box<kshard::server::ServeConfig>),
    /// Print the flowcontrol.kshard.dev CustomResourceDefinitions (YAML).
    Crds,
    /// Print the manifests that run kshard as an aggregated APIService (YAML).
    Manifests(kshard::manifests::ManifestsArgs),
}

/// The glibc tunable that keeps `memcpy` off `rep movsb` for large copies.
const VECTOR_COPIES: &str = "glibc.cpu.x86_rep_movsb_threshold=18446744073709551615";

/// glibc (2.36 in Debian 12) copies anything from 2,112 bytes on with
/// `rep movsb`, which on the AMD EPYC machines here ran far slower than its
/// vector loop. Every watch frame and response body is
/// such a copy inside rustls: `perf` showed `memcpy` at 11 % of the
/// server's CPU with 100 watchers, moving 2.4 GB/s. The tunable must be in
/// the environment when the process starts, so `serve` on an AMD CPU
/// starts itself again with it (same pid, arguments and descriptors),
/// unless `GLIBC_TUNABLES` is already set: an operator's own tunables win.
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
fn prefer_vector_copies() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next();
    let serving = std::env::args_os().nth(1).is_some_and(|a| a == "serve");
    if !serving || std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    // Leaf 0: the vendor's name.
    let id = std::arch::x86_64::__cpuid(0);
    let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .collect();
    if vendor != b"AuthenticAMD" {
        return;
    }
    let mut again = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = arg0 {
        again.arg0(arg0);
    }
    // Returns only when the exec failed: serve as we are.
    let _ = again.args(args).env("GLIBC_TUNABLES", VECTOR_COPIES).exec();
}

#[cfg(not(all(target_arch = "x86_64", target_env = "gnu")))]
fn prefer_vector_copies() {}

fn main() -> anyhow::Result<()> {
    prefer_vector_copies();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(cfg) => {
                let cfg = kshard::server::ServeConfig {
                    in_cluster: kshard::host::in_cluster(),
                    ..*cfg
                };
                let running = kshard::server::start(cfg)
                    .await
                    .context("starting kshard")?;
                println!(
                    "kshard is serving on https://{}\n  kubectl --kubeconfig {} get widgets",
                    running.addr,
                    running.kubeconfig.display()
                );
                // Kubernetes stops pods with SIGTERM; a terminal with ctrl-c.
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .context("installing the SIGTERM handler")?;
                tokio::select! {
                    r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
                    _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                }
                // A second signal stops at once.
                tokio::select! {
                    _ = running.shutdown_gracefully() => {}
                    _ = tokio::signal::ctrl_c() => tracing::warn!("second signal: stopping now"),
                    _ = term.recv() => tracing::warn!("second signal: stopping now"),
                }
                Ok(())
            }
            Command::Manifests(a) => {
                print!(
                    "{}",
                    kshard::manifests::render(&a).context("rendering the manifests")?
                );
                Ok(())
            }
            Command::Crds => {
                print!("{}", kshard::controller::crd::manifests_yaml());
                Ok(())
            }
        }
    })
}
