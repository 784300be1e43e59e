//! Drives etcd with the `etcd-client` crate for `benches/etcd.rs`.
//!
//! `etcd-driver --endpoint http://127.0.0.1:P --op put|update|delete
//!  --clients N --secs S --channel shared|per-worker --prefix P
//!  [--value-bytes 1024] [--keys K] [--server-pid PID]`
//!
//! Writes what kube-apiserver would write for the same Kubernetes verb:
//! `put` a plain put per create (the cheapest create etcd can do),
//! `update` kube's GuaranteedUpdate transaction (put if the key's
//! mod_revision is still the one last seen, else get), `delete` kube's
//! conditional delete transaction on keys created before the clock starts.
//! `shared` gives every worker one client (one HTTP/2 connection, as
//! kube-apiserver multiplexes its requests); `per-worker` one each.
//! Prints one JSON line: ops, elapsed, latencies and the driver's own CPU
//! (and etcd's, given its pid) during the timed part only.

use std::time::{Duration, Instant};

mod disk;

use etcd_client::{Client, Compare, CompareOp, KvClient, Txn, TxnOp};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    endpoint: String,
    op: String,
    clients: usize,
    secs: f64,
    shared: bool,
    prefix: String,
    value_bytes: usize,
    keys: usize,
    server_pid: Option<u32>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        endpoint: String::new(),
        op: "put".into(),
        clients: 1,
        secs: 10.0,
        shared: true,
        prefix: "/bench/driver".into(),
        value_bytes: 1024,
        keys: 1000,
        server_pid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--endpoint" => a.endpoint = value,
            "--op" => a.op = value,
            "--clients" => a.clients = num(&value)? as usize,
            "--secs" => a.secs = num(&value)?,
            "--channel" => a.shared = value == "shared",
            "--prefix" => a.prefix = value,
            "--value-bytes" => a.value_bytes = num(&value)? as usize,
            "--keys" => a.keys = num(&value)? as usize,
            "--server-pid" => a.server_pid = Some(num(&value)? as u32),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.endpoint.is_empty() {
        return Err("--endpoint is required".into());
    }
    Ok(a)
}

/// A process's CPU (user + system) in seconds, from /proc (`self` or a pid).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name's closing parenthesis; utime and stime
    // are the 14th and 15th fields of the line, in clock ticks (100 Hz).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// One worker's keys, prepared before the clock starts: the key and the
/// mod_revision its last write got.
async fn prepare(
    kv: &mut KvClient,
    a: &Args,
    w: usize,
    value: &[u8],
) -> Result<Vec<(String, i64)>, etcd_client::Error> {
    let count = match a.op.as_str() {
        "update" => 1,
        "delete" => a.keys,
        _ => 0,
    };
    let mut keys = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("{}-w{w}-{i}", a.prefix);
        let resp = kv.put(key.clone(), value.to_vec(), None).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        keys.push((key, rev));
    }
    Ok(keys)
}

async fn work(
    mut kv: KvClient,
    op: String,
    prefix: String,
    w: usize,
    value: Vec<u8>,
    mut keys: Vec<(String, i64)>,
    until: Instant,
) -> (Vec<Duration>, usize, Option<String>) {
    let (mut lat, mut errors) = (Vec::new(), 0usize);
    let mut first_error = None;
    let mut i = 0usize;
    while Instant::now() < until {
        let t = Instant::now();
        let outcome = match op.as_str() {
            "update" => {
                let Some((key, rev)) = keys.first_mut() else {
                    break;
                };
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)])
                    .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                    .or_else([TxnOp::get(key.clone(), None)]);
                match kv.txn(txn).await {
                    Ok(r) if r.succeeded() => {
                        *rev = r.header().map_or(0, |h| h.revision());
                        Ok(())
                    }
                    Ok(_) => Err("compare failed".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            "delete" => {
                let Some((key, rev)) = keys.pop() else {
                    break;
                };
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::delete(key.clone(), None)])
                    .or_else([TxnOp::get(key, None)]);
                match kv.txn(txn).await {
                    Ok(r) if r.succeeded() => Ok(()),
                    Ok(_) => Err("compare failed".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            _ => {
                let key = format!("{prefix}-w{w}-{i}");
                i += 1;
                kv.put(key, value.clone(), None)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        match outcome {
            Ok(()) => lat.push(t.elapsed()),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    (lat, errors, first_error)
}

async fn run(a: Args) -> Result<serde_json::Value, String> {
    let value = vec![b'x'; a.value_bytes];
    let connect = || async {
        Client::connect([a.endpoint.as_str()], None)
            .await
            .map_err(|e| format!("connect {}: {e}", a.endpoint))
    };
    let shared = if a.shared {
        Some(connect().await?)
    } else {
        None
    };
    let mut workers = Vec::new();
    for w in 0..a.clients {
        let client = match &shared {
            Some(c) => c.clone(),
            None => connect().await?,
        };
        let mut kv = client.kv_client();
        let keys = prepare(&mut kv, &a, w, &value)
            .await
            .map_err(|e| format!("prepare: {e}"))?;
        workers.push((kv, keys));
    }
    let server = a.server_pid.map(|p| p.to_string());
    let disk = disk::disk_written();
    let server_cpu = server.as_deref().map(cpu_seconds);
    let cpu = cpu_seconds("self");
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(a.secs);
    let mut handles = Vec::new();
    for (w, (kv, keys)) in workers.into_iter().enumerate() {
        handles.push(tokio::spawn(work(
            kv,
            a.op.clone(),
            a.prefix.clone(),
            w,
            value.clone(),
            keys,
            until,
        )));
    }
    let (mut lat, mut errors, mut first_error) = (Vec::new(), 0, None);
    for h in handles {
        let (l, e, first) = h.await.map_err(|e| format!("worker: {e}"))?;
        lat.extend(l);
        errors += e;
        first_error = first_error.or(first);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds("self") - cpu;
    let server_cpu = server
        .as_deref()
        .zip(server_cpu)
        .map(|(p, before)| cpu_seconds(p) - before);
    let disk = disk::disk_written().saturating_sub(disk);
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(serde_json::json!({
        "ops": lat.len(), "errors": errors, "first_error": first_error,
        "elapsed_secs": elapsed,
        "p50_ms": pct(0.5), "p99_ms": pct(0.99), "cpu_secs": cpu,
        "server_cpu_secs": server_cpu, "disk_written_bytes": disk,
    }))
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("etcd-driver: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("etcd-driver: runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(run(a)) {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("etcd-driver: {e}");
            std::process::exit(1);
        }
    }
}
