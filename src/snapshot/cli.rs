//! `kshard snapshot save | restore | status`: the command line.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use super::restore::{self, Target, DEFAULT_BUMP_REVISION};
use super::save::{self, Saved};
use super::{human_bytes, Progress, SnapshotError};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent snapshot of a running shard (through its API, as an
    /// administrator) or of a TiKV store (read directly) to FILE.
    Save(SaveArgs),
    /// Restore FILE into a new embedded data directory, or a TiKV prefix
    /// with --store; then start `kshard serve` on it.
    Restore(RestoreArgs),
    /// Check FILE whole (every checksum, the digest) and print what it holds.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct SaveArgs {
    /// Where the snapshot goes (written as FILE.part, renamed once whole).
    pub file: PathBuf,
    /// Kubeconfig of an administrator of the shard; default: the data
    /// directory's, which `kshard serve` writes (system:masters).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context of --kubeconfig to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Data directory whose kubeconfig is the default.
    #[arg(long, default_value = "./kshard-data")]
    pub data_dir: PathBuf,
    /// Read the store itself instead of asking a server:
    /// `tikv://pd:2379[,...]?prefix=<shard>`, or `embedded` for the store
    /// of --data-dir while no server runs on it (a running server holds it
    /// open: save through its API then).
    #[arg(long, conflicts_with_all = ["kubeconfig", "context"])]
    pub store: Option<String>,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The snapshot to restore.
    pub file: PathBuf,
    /// Data directory to restore the embedded store into (created if missing).
    #[arg(long, default_value = "./kshard-data")]
    pub data_dir: PathBuf,
    /// Restore into this store instead: `tikv://pd:2379[,...]?prefix=<shard>`.
    #[arg(long)]
    pub store: Option<String>,
    /// Replace what the target holds (never while a server or replica runs on it).
    #[arg(long)]
    pub force: bool,
    /// Start the restored revision counter this far above the snapshot's
    /// revision, so clients that saw later revisions of the source get 410
    /// and re-list (0: exactly the snapshot's revision).
    #[arg(long, default_value_t = DEFAULT_BUMP_REVISION)]
    pub bump_revision: u64,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The snapshot to check.
    pub file: PathBuf,
    /// `text`, or `json` (the header, the trailer and the file's size).
    #[arg(long, short, value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs a snapshot command; what it did goes to stdout, progress to stderr.
pub async fn run(cmd: SnapshotCommand) -> Result<(), SnapshotError> {
    match cmd {
        SnapshotCommand::Save(a) => {
            let mut progress = Progress::new("saving", a.quiet);
            let saved = match &a.store {
                Some(url) => {
                    let (url, file) = (url.clone(), a.file.clone());
                    let db = a.data_dir.join(crate::storage::embedded::STORE_FILE);
                    let quiet = a.quiet;
                    blocking(move || {
                        let embedded = matches!(url.as_str(), "" | "embedded");
                        if embedded && !db.exists() {
                            return Err(SnapshotError::Refused(format!(
                                "no embedded store at {}",
                                db.display()
                            )));
                        }
                        let engine = crate::storage::open_engine(
                            Some(&url),
                            &db,
                            restore::CACHE_BYTES,
                        )
                        .map_err(|e| {
                            if embedded {
                                SnapshotError::Refused(format!(
                                    "{} cannot be opened (is a kshard serving it? then save through its API): {e}",
                                    db.display()
                                ))
                            } else {
                                e.into()
                            }
                        })?;
                        let mut p = Progress::new("saving", quiet);
                        let saved = save::write_from_engine(&*engine, &file, &mut p);
                        p.done();
                        engine.close();
                        saved
                    })
                    .await?
                }
                None => {
                    let kubeconfig = a
                        .kubeconfig
                        .clone()
                        .unwrap_or_else(|| a.data_dir.join("kubeconfig"));
                    let client = client(&kubeconfig, a.context.clone()).await?;
                    let saved = save::save_via_api(client, &a.file, &mut progress).await?;
                    progress.done();
                    saved
                }
            };
            print_saved(&saved, progress.done());
            Ok(())
        }
        SnapshotCommand::Restore(a) => {
            let target = match a.store.as_deref() {
                None | Some("" | "embedded") => Target::Embedded(a.data_dir.clone()),
                Some(url) => Target::Store(url.to_string()),
            };
            let opts = restore::Options {
                force: a.force,
                bump_revision: a.bump_revision,
            };
            let file = a.file.clone();
            let quiet = a.quiet;
            let started = std::time::Instant::now();
            let t = target.clone();
            let restored = blocking(move || {
                let mut verifying = Progress::new("verifying", quiet);
                let mut writing = Progress::new("restoring", quiet);
                let r = restore::restore(&file, &t, opts, &mut verifying, &mut writing);
                writing.done();
                r
            })
            .await?;
            let into = match &target {
                Target::Embedded(dir) => format!("data directory {}", dir.display()),
                Target::Store(url) => url.clone(),
            };
            println!(
                "restored {} into {into}: {} objects as of revision {}; the restored shard's revision starts at {} (history compacted there), in {:.2} s",
                a.file.display(),
                restored.trailer.objects,
                restored.header.revision,
                restored.revision,
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        SnapshotCommand::Status(a) => {
            let file = a.file.clone();
            let (header, trailer) = blocking(move || {
                let mut quiet = Progress::new("verifying", true);
                restore::verify(&file, &mut quiet)
            })
            .await?;
            let size = std::fs::metadata(&a.file).map(|m| m.len()).unwrap_or(0);
            match a.output {
                Output::Json => println!(
                    "{}",
                    json!({"header": header, "trailer": trailer, "fileBytes": size})
                ),
                Output::Text => {
                    println!(
                        "file:           {} ({})",
                        a.file.display(),
                        human_bytes(size)
                    );
                    println!("format:         {}", header.format_version);
                    println!("kshard version: {}", header.kshard_version);
                    println!(
                        "taken from:     {}{}",
                        header.engine,
                        header
                            .shard
                            .as_deref()
                            .map(|s| format!(" (shard {s})"))
                            .unwrap_or_default()
                    );
                    println!("revision:       {}", header.revision);
                    println!("created:        {}", header.created_at);
                    println!(
                        "objects:        {} ({} of JSON)",
                        trailer.objects,
                        human_bytes(trailer.object_bytes)
                    );
                    println!("sha256:         {}", trailer.sha256);
                    println!("checked:        every frame and the digest");
                }
            }
            Ok(())
        }
    }
}

fn print_saved(saved: &Saved, took: std::time::Duration) {
    println!(
        "saved {}: revision {}, {} objects ({} of JSON), {} written, sha256 {}, in {:.2} s",
        saved.path.display(),
        saved.header.revision,
        saved.trailer.objects,
        human_bytes(saved.trailer.object_bytes),
        human_bytes(saved.bytes),
        saved.trailer.sha256,
        took.as_secs_f64()
    );
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SnapshotError> + Send + 'static,
) -> Result<T, SnapshotError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SnapshotError::Client(e.to_string()))?
}

async fn client(
    kubeconfig: &std::path::Path,
    context: Option<String>,
) -> Result<kube::Client, SnapshotError> {
    let bad =
        |e: String| SnapshotError::Client(format!("kubeconfig {}: {e}", kubeconfig.display()));
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let options = kube::config::KubeConfigOptions {
        context,
        ..Default::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|e| bad(e.to_string()))?;
    // One request whose answer streams for as long as the store takes to
    // read: kube-rs's retries would start it over.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
}
