//! Engine fixtures for the storage conformance suite: each gives fresh
//! engine instances on one persistent data set (so a test can drop a store and
//! reopen it, as after a crash).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kshard::storage::embedded::Embedded;
use kshard::storage::engine::Engine;
use kshard::storage::Store;

pub trait Fixture: Send + Sync {
    /// A new engine instance on this fixture's data.
    fn engine(&self) -> Arc<dyn Engine>;

    fn store(&self) -> Arc<Store> {
        Store::open(self.engine()).expect("open store")
    }
}

pub struct EmbeddedFixture {
    dir: tempfile::TempDir,
}

pub fn embedded() -> EmbeddedFixture {
    EmbeddedFixture {
        dir: tempfile::tempdir().expect("tempdir"),
    }
}

impl Fixture for EmbeddedFixture {
    fn engine(&self) -> Arc<dyn Engine> {
        // A dropped store's writer thread may still hold the file for a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Embedded::open(&self.dir.path().join("store.redb")) {
                Ok(e) => return Arc::new(e),
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("opening redb: {e}"),
            }
        }
    }
}

#[cfg(feature = "tikv")]
pub use tikv::*;

#[cfg(feature = "tikv")]
mod tikv {
    use super::*;
    use kshard::storage::tikv::{Tikv, TikvUrl};
    use tikv_double::TikvDouble;

    /// The TiKV engine on the in-process double, or on a real cluster when
    /// `KSHARD_TEST_PD=host:port[,...]` is set (each fixture then uses its own
    /// random shard prefix).
    pub struct TikvFixture {
        pub double: Option<TikvDouble>,
        pub url: TikvUrl,
    }

    pub fn tikv() -> TikvFixture {
        let shard = format!("t{}", uuid::Uuid::new_v4().simple());
        match std::env::var("KSHARD_TEST_PD") {
            Ok(pd) if !pd.trim().is_empty() => TikvFixture {
                double: None,
                url: TikvUrl::parse(&format!("tikv://{pd}?prefix={shard}")).expect("url"),
            },
            _ => {
                // Split the keyspace inside this shard's keys: the latest
                // records, the event log and the versions of objects named
                // before and after "m" live in different regions.
                let base = format!("kshard/{shard}/");
                let splits = ["l/", "v/g/r/ns/m"]
                    .iter()
                    .map(|s| format!("{base}{s}").into_bytes())
                    .collect();
                let double = TikvDouble::start_with_splits(splits).expect("start double");
                let url =
                    TikvUrl::parse(&format!("tikv://{}?prefix={shard}", double.pd_endpoint()))
                        .expect("url");
                TikvFixture {
                    double: Some(double),
                    url,
                }
            }
        }
    }

    impl TikvFixture {
        pub fn tikv_engine(&self) -> Arc<Tikv> {
            Arc::new(Tikv::connect(&self.url).expect("connect to TiKV"))
        }

        /// The double, for tests that inject faults (skipped on a real cluster).
        pub fn double(&self) -> Option<&TikvDouble> {
            self.double.as_ref()
        }
    }

    impl Fixture for TikvFixture {
        fn engine(&self) -> Arc<dyn Engine> {
            self.tikv_engine()
        }
    }
}
