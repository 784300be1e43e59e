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
    /// Back up and restore a shard; move it between engines.
    #[command(subcommand)]
    Snapshot(kshard::snapshot::cli::SnapshotCommand),
}

/// Transparent huge pages off for this process. mimalloc asks for them on
/// its arenas (`MADV_HUGEPAGE`), and each first touch of a 2 MiB region,
/// again after mimalloc gives freed memory back, zeroed the whole of it in
/// the faulting request: at 64 concurrent creates that was 6 % of the
/// server's CPU and doubled the p99 (11 ms against 5.6 ms; databases such
/// as Redis and MongoDB advise the same). Done before anything else is
/// allocated; only kernels older than 3.15 refuse.
#[cfg(target_os = "linux")]
fn no_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and touches no memory of ours.
    match unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn main() -> anyhow::Result<()> {
    #[cfg(target_os = "linux")]
    let huge_pages = no_transparent_huge_pages();
    let cli = Cli::parse();
    match &cli.command {
        Command::Serve(cfg) => kshard::logging::init(cfg.logging_format),
        _ => kshard::logging::init_with(kshard::logging::LogFormat::Text, "warn"),
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = huge_pages {
        tracing::warn!(error = %e, "transparent huge pages could not be turned off");
    }
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
            Command::Snapshot(cmd) => Ok(kshard::snapshot::cli::run(cmd).await?),
            Command::Crds => {
                print!("{}", kshard::controller::crd::manifests_yaml());
                Ok(())
            }
        }
    })
}
