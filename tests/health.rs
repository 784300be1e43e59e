//! `/livez` and `/readyz` check the store for real: a store that cannot answer
//! within the deadline fails both probes, by name, and they pass again when
//! it recovers. The store here is TiKV (the TIKV DOUBLE), whose reads can be
//! held up on the wire.
#![cfg(feature = "tikv")]

mod common;

use std::time::Duration;

async fn probe(s: &common::TestServer, path: &str) -> (u16, String) {
    let r = s.get(path).await;
    (r.status, r.text())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_does_not_answer_fails_readyz_and_livez() {
    let double = tikv_double::TikvDouble::start().expect("tikv double");
    let pd = double.pd_endpoint();
    let s = common::start_with(move |c| {
        c.store = Some(format!("tikv://{pd}?prefix=health"));
    })
    .await;
    let (code, body) = probe(&s, "/readyz?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]storage ok\n"), "{body}");
    let (code, body) = probe(&s, "/livez?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]storage ok\n"), "{body}");

    // Every read now waits far longer than the check's deadline.
    double.set_delay("KvGet", Duration::from_secs(60));
    let (code, body) = probe(&s, "/readyz?verbose").await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]storage failed: reason withheld\n"),
        "{body}"
    );
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    let (code, body) = probe(&s, "/livez").await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]storage failed: reason withheld\n"),
        "{body}"
    );
    assert_eq!(probe(&s, "/readyz/storage").await.0, 500);
    // Excluding the check is how an operator looks past it, as in kube.
    assert_eq!(probe(&s, "/readyz?exclude=storage").await.0, 200);

    double.clear_faults();
    common::eventually("the storage check passes again", || async {
        probe(&s, "/readyz/storage").await.0 == 200
    })
    .await;
    assert_eq!(probe(&s, "/livez").await, (200, "ok".to_string()));
}

/// TiKV unreachable at start: a clear message, retried with backoff, no panic.
#[tokio::test(flavor = "multi_thread")]
async fn unreachable_tikv_at_start_is_retried_with_a_clear_message() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tmp");
    // A port nothing listens on: bound, then closed, so connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(common::repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args([
            "--store",
            &format!("tikv://127.0.0.1:{port}?prefix=unreachable"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kshard");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut attempts = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while attempts < 2 {
        let line = tokio::task::block_in_place(|| lines.recv_timeout(Duration::from_secs(60)))
            .expect("kshard keeps logging while it retries");
        assert!(!line.contains("panicked"), "{line}");
        if line.contains("cannot reach the TiKV cluster") && line.contains("retry_in") {
            attempts += 1;
        }
        assert!(std::time::Instant::now() < deadline, "no retry logged");
    }
    assert!(
        child.try_wait().expect("wait").is_none(),
        "kshard exited instead of retrying"
    );
    let _ = child.kill();
    let _ = child.wait();
}
