//! Several `kshard serve` processes as replicas of one shard on a TiKV test
//! double (see tests/replicas.rs and benches/replicas.rs).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One replica process.
pub struct ReplicaProcess {
    pub id: String,
    pub data: PathBuf,
    pub child: Child,
    pub https: String,
}

/// Starts `kshard serve` as replica `id` of shard `prefix` on the double at
/// `pd`, with the default lease settings; returns once it serves. Its log
/// goes to `<dir>/<id>.log`.
pub fn spawn_replica(dir: &Path, id: &str, pd: &str, prefix: &str) -> ReplicaProcess {
    spawn_replica_with(dir, id, pd, prefix, &[])
}

/// [`spawn_replica`] with a lease of `lease` (a duration such as `20s`).
pub fn spawn_replica_with_lease(
    dir: &Path,
    id: &str,
    pd: &str,
    prefix: &str,
    lease: &str,
) -> ReplicaProcess {
    spawn_replica_with(dir, id, pd, prefix, &["--lease-duration", lease])
}

/// [`spawn_replica`] with more `kshard serve` flags.
pub fn spawn_replica_with(
    dir: &Path,
    id: &str,
    pd: &str,
    prefix: &str,
    extra: &[&str],
) -> ReplicaProcess {
    let data = dir.join(id);
    std::fs::create_dir_all(&data).expect("data dir");
    let log = std::fs::File::create(dir.join(format!("{id}.log"))).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(super::repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(&data)
        .arg("--store")
        .arg(format!("tikv://{pd}?prefix={prefix}"))
        .args(["--replica-id", id])
        // Port 0: the replica binds a free port itself and advertises the bound
        // address (no race with other tests for a port picked in advance).
        .args(["--internal-listen", "127.0.0.1:0"])
        .args(["--compaction-interval", "1h"])
        .args(extra)
        .env("RUST_LOG", "info,kshard::replica=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn kshard");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    // A replica that exits before it serves says why in its log.
    let first = match lines.next() {
        Some(Ok(line)) => line,
        other => {
            let log = std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "{id} printed no first line ({other:?}); the end of its log:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    };
    let https = first
        .strip_prefix("kshard is serving on ")
        .unwrap_or_else(|| panic!("{id}: {first}"))
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    ReplicaProcess {
        id: id.to_string(),
        data,
        child,
        https,
    }
}

impl ReplicaProcess {
    pub fn kubeconfig(&self) -> PathBuf {
        self.data.join("kubeconfig")
    }

    pub async fn client(&self) -> kube::Client {
        super::client_for(&self.kubeconfig()).await
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `/readyz` answers 200 (the replica follows the leader).
pub async fn wait_ready(client: &kube::Client, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let req = http::Request::get("/readyz?verbose")
            .body(Vec::new())
            .expect("request");
        match client.request_text(req).await {
            Ok(_) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("not ready: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The store the replicas share: the TiKV test double, its regions split
/// inside the shard (the lease and counter, the event log and the versions
/// in different regions), or a real cluster when `KSHARD_TEST_PD` is set.
/// Returns the double (keep it alive), the PD endpoint and a fresh shard prefix.
#[cfg(feature = "tikv")]
pub fn shared_store() -> (Option<tikv_double::TikvDouble>, String, String) {
    let shard = format!("r{}", uuid::Uuid::new_v4().simple());
    if let Ok(pd) = std::env::var("KSHARD_TEST_PD") {
        if !pd.trim().is_empty() {
            return (None, pd, shard);
        }
    }
    let splits = ["l/", "m/", "v/"]
        .iter()
        .map(|s| format!("kshard/{shard}/{s}").into_bytes())
        .collect();
    let double = tikv_double::TikvDouble::start_with_splits(splits).expect("double");
    let pd = double.pd_endpoint();
    (Some(double), pd, shard)
}
