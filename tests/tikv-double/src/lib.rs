//! **A test double of a TiKV + PD cluster** for kshard's storage tests — not
//! TiKV, not PD, and never part of the kshard binary.
//!
//! One in-process gRPC server on `127.0.0.1` speaks the real kvproto wire
//! protocol (the `pdpb.PD` and `tikvpb.Tikv` methods tikv-client 0.4 calls for
//! optimistic transactions) on top of an in-memory Percolator store
//! ([`mvcc`]): MVCC versions keyed by commit timestamp, locks, write conflicts,
//! snapshot reads, lock resolution and a GC safe point. The keyspace is split
//! into several static regions (one store, one leader peer each) so that
//! tikv-client's region cache, cross-region scans and multi-region two-phase
//! commits are exercised. Faults can be injected: drop the next N responses of
//! a method (the request is applied, the client sees `Unavailable`), delay a
//! method, or kill every open client connection.
//!
//! Compiled only with the `server` feature (which kshard's `tikv` feature
//! turns on for its tests); without it this crate is empty.

// Errors here are the generated kvproto/tonic messages that go on the wire as
// they are; boxing them would only add conversions.
#![allow(clippy::result_large_err)]

#[cfg(feature = "server")]
pub mod proto {
    //! Server code generated from the vendored kvproto files (see `build.rs`).
    #![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    include!(concat!(env!("OUT_DIR"), "/protos.rs"));
}

#[cfg(feature = "server")]
pub mod codec;
#[cfg(feature = "server")]
pub mod mvcc;
#[cfg(feature = "server")]
mod service;

#[cfg(feature = "server")]
pub use double::{TikvDouble, DEFAULT_REGION_SPLITS};

#[cfg(feature = "server")]
mod double {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;

    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    use crate::mvcc::Mvcc;
    use crate::service::Cluster;

    /// Splits used by [`TikvDouble::start`]: three regions.
    pub const DEFAULT_REGION_SPLITS: &[&[u8]] = &[b"kshard/m", b"kshard/t"];

    /// A running double; dropping it stops the server and forgets all data.
    pub struct TikvDouble {
        addr: SocketAddr,
        cluster: Arc<Cluster>,
        /// Bumped to close every proxied client connection.
        kill: watch::Sender<u64>,
        /// Holds every proxied byte while set.
        frozen: watch::Sender<bool>,
        runtime: Option<tokio::runtime::Runtime>,
    }

    #[derive(Default)]
    pub(crate) struct Faults {
        pub drop_next: HashMap<String, usize>,
        pub delay: HashMap<String, Duration>,
    }

    impl TikvDouble {
        /// Starts a double with [`DEFAULT_REGION_SPLITS`].
        pub fn start() -> std::io::Result<Self> {
            Self::start_with_splits(DEFAULT_REGION_SPLITS.iter().map(|s| s.to_vec()).collect())
        }

        /// Starts a double whose regions are split at `splits` (raw keys).
        ///
        /// Runs on its own runtime so it never depends on (or blocks) the
        /// caller's: callers may use it from sync code or any runtime.
        pub fn start_with_splits(mut splits: Vec<Vec<u8>>) -> std::io::Result<Self> {
            splits.sort();
            splits.dedup();
            splits.retain(|s| !s.is_empty());
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("tikv-double")
                .enable_all()
                .build()?;
            // Clients connect to a proxy; the proxy lets tests cut connections.
            let public = std::net::TcpListener::bind("127.0.0.1:0")?;
            let internal = std::net::TcpListener::bind("127.0.0.1:0")?;
            public.set_nonblocking(true)?;
            internal.set_nonblocking(true)?;
            let addr = public.local_addr()?;
            let internal_addr = internal.local_addr()?;
            let cluster = Arc::new(Cluster::new(format!("http://{addr}"), &splits));
            let (kill, killed) = watch::channel(0u64);
            let (frozen, thawed) = watch::channel(false);
            {
                let _guard = runtime.enter();
                let internal = TcpListener::from_std(internal)?;
                let public = TcpListener::from_std(public)?;
                runtime.spawn(crate::service::serve(cluster.clone(), internal));
                runtime.spawn(proxy(public, internal_addr, killed, thawed));
            }
            Ok(Self {
                addr,
                cluster,
                kill,
                frozen,
                runtime: Some(runtime),
            })
        }

        /// The PD endpoint to give tikv-client (`host:port`).
        pub fn pd_endpoint(&self) -> String {
            self.addr.to_string()
        }

        /// The next `n` responses of gRPC method `method` (e.g. `"KvCommit"`,
        /// `"KvPrewrite"`, `"GetRegion"`) are lost: the request is still
        /// applied, the client gets `Unavailable`.
        pub fn drop_responses(&self, method: &str, n: usize) {
            *self
                .faults()
                .drop_next
                .entry(method.to_string())
                .or_default() += n;
        }

        /// Every call of `method` waits `delay` before it is handled (zero clears).
        pub fn set_delay(&self, method: &str, delay: Duration) {
            let mut f = self.faults();
            if delay.is_zero() {
                f.delay.remove(method);
            } else {
                f.delay.insert(method.to_string(), delay);
            }
        }

        /// Removes every pending drop and delay.
        pub fn clear_faults(&self) {
            let mut f = self.faults();
            f.drop_next.clear();
            f.delay.clear();
        }

        /// While `frozen`, nothing goes through any connection (PD's and
        /// TiKV's, open or new), as with a cluster that stopped (SIGSTOP):
        /// calls hang with their connections open, and go on once it thaws.
        pub fn set_frozen(&self, frozen: bool) {
            self.frozen.send_replace(frozen);
        }

        /// Responses still to be dropped for `method`.
        pub fn pending_drops(&self, method: &str) -> usize {
            self.faults().drop_next.get(method).copied().unwrap_or(0)
        }

        /// Closes every client connection open now (new ones are accepted).
        pub fn kill_connections(&self) {
            self.kill.send_modify(|g| *g += 1);
        }

        /// Locks currently held (a finished workload should leave none behind
        /// once readers have resolved them).
        pub fn lock_count(&self) -> usize {
            self.mvcc().lock_count()
        }

        /// The GC safe point PD has recorded.
        pub fn gc_safe_point(&self) -> u64 {
            self.mvcc().gc_safe_point
        }

        /// Commit timestamps of the data versions of a raw key.
        pub fn versions(&self, key: &[u8]) -> Vec<u64> {
            self.mvcc().versions(key)
        }

        /// Number of regions.
        pub fn region_count(&self) -> usize {
            self.cluster.regions.len()
        }

        fn faults(&self) -> MutexGuard<'_, Faults> {
            self.cluster
                .faults
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        }

        fn mvcc(&self) -> MutexGuard<'_, Mvcc> {
            self.cluster.mvcc.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl Drop for TikvDouble {
        fn drop(&mut self) {
            if let Some(rt) = self.runtime.take() {
                rt.shutdown_background();
            }
        }
    }

    /// Forwards each client connection to the gRPC server until the kill generation changes.
    async fn proxy(
        public: TcpListener,
        server: SocketAddr,
        killed: watch::Receiver<u64>,
        frozen: watch::Receiver<bool>,
    ) {
        loop {
            let Ok((client, _)) = public.accept().await else {
                continue;
            };
            let mut killed = killed.clone();
            let generation = *killed.borrow_and_update();
            let frozen = frozen.clone();
            tokio::spawn(async move {
                let Ok(upstream) = TcpStream::connect(server).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let (client_rx, client_tx) = client.into_split();
                let (upstream_rx, upstream_tx) = upstream.into_split();
                tokio::select! {
                    _ = pump(client_rx, upstream_tx, frozen.clone()) => {}
                    _ = pump(upstream_rx, client_tx, frozen) => {}
                    _ = killed.wait_for(|g| *g != generation) => {
                        tracing::debug!("tikv double: connection killed");
                    }
                }
                // Dropping both sockets closes the connection on both sides.
            });
        }
    }

    /// Copies `from` to `to`, holding the bytes while the double is frozen.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}
