//! The double's gRPC services: PD (members, TSO, regions, stores, GC safe
//! point) and TiKV's transactional Kv methods, over [`crate::mvcc`].

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

use crate::codec;
use crate::double::{lock, Faults};
use crate::mvcc::{Mvcc, TxnStatus};
use crate::proto::pdpb::pd_server::{Pd, PdServer};
use crate::proto::tikvpb::tikv_server::{Tikv, TikvServer};
use crate::proto::{errorpb, kvrpcpb, metapb, pdpb};

const CLUSTER_ID: u64 = 7_000_001;
const STORE_ID: u64 = 1;
const MEMBER_ID: u64 = 11;

pub(crate) struct RegionDef {
    pub id: u64,
    pub start: Vec<u8>,
    /// Empty = unbounded.
    pub end: Vec<u8>,
}

impl RegionDef {
    fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && (self.end.is_empty() || key < self.end.as_slice())
    }

    fn epoch() -> metapb::RegionEpoch {
        metapb::RegionEpoch {
            conf_ver: 1,
            version: 1,
        }
    }

    fn peer(&self) -> metapb::Peer {
        metapb::Peer {
            id: 1000 + self.id,
            store_id: STORE_ID,
            ..Default::default()
        }
    }

    /// The region as PD describes it: bounds in memcomparable encoding.
    fn meta(&self) -> metapb::Region {
        let enc = |k: &[u8]| {
            if k.is_empty() {
                Vec::new()
            } else {
                codec::encode(k)
            }
        };
        metapb::Region {
            id: self.id,
            start_key: enc(&self.start),
            end_key: enc(&self.end),
            region_epoch: Some(Self::epoch()),
            peers: vec![self.peer()],
            ..Default::default()
        }
    }
}

pub(crate) struct Cluster {
    pub url: String,
    pub regions: Vec<RegionDef>,
    pub mvcc: Mutex<Mvcc>,
    pub faults: Mutex<Faults>,
    /// The last timestamp handed out (shared with open TSO streams).
    tso: Arc<Mutex<u64>>,
}

impl Cluster {
    pub fn new(url: String, splits: &[Vec<u8>]) -> Self {
        let mut regions = Vec::new();
        let mut start = Vec::new();
        for (i, s) in splits
            .iter()
            .chain(std::iter::once(&Vec::new()))
            .enumerate()
        {
            regions.push(RegionDef {
                id: 2 + i as u64,
                start: std::mem::replace(&mut start, s.clone()),
                end: s.clone(),
            });
        }
        Self {
            url,
            regions,
            mvcc: Mutex::new(Mvcc::default()),
            faults: Mutex::new(Faults::default()),
            tso: Arc::new(Mutex::new(0)),
        }
    }

    fn region_by_key(&self, key: &[u8]) -> &RegionDef {
        self.regions
            .iter()
            .find(|r| r.contains(key))
            .unwrap_or(&self.regions[self.regions.len() - 1])
    }

    /// Checks that a request for `keys` was routed to the region that holds them.
    fn check_region<'a>(
        &'a self,
        ctx: &Option<kvrpcpb::Context>,
        keys: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<&'a RegionDef, errorpb::Error> {
        let id = ctx.as_ref().map_or(0, |c| c.region_id);
        let Some(region) = self.regions.iter().find(|r| r.id == id) else {
            return Err(errorpb::Error {
                message: format!("region {id} not found"),
                region_not_found: Some(errorpb::RegionNotFound { region_id: id }),
                ..Default::default()
            });
        };
        let epoch_ok = ctx
            .as_ref()
            .and_then(|c| c.region_epoch.as_ref())
            .is_none_or(|e| *e == RegionDef::epoch());
        if !epoch_ok {
            return Err(errorpb::Error {
                message: "epoch not match".into(),
                epoch_not_match: Some(errorpb::EpochNotMatch {
                    current_regions: vec![region.meta()],
                }),
                ..Default::default()
            });
        }
        for key in keys {
            if !region.contains(key) {
                return Err(errorpb::Error {
                    message: "key not in region".into(),
                    key_not_in_region: Some(errorpb::KeyNotInRegion {
                        key: key.to_vec(),
                        region_id: region.id,
                        start_key: region.start.clone(),
                        end_key: region.end.clone(),
                    }),
                    ..Default::default()
                });
            }
        }
        Ok(region)
    }

    async fn before(&self, method: &str) {
        let delay = lock(&self.faults).delay.get(method).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }

    /// Called once the request has been applied: maybe lose the response.
    fn deliver<T>(&self, method: &str, resp: T) -> Result<Response<T>, Status> {
        let mut f = lock(&self.faults);
        if let Some(n) = f.drop_next.get_mut(method) {
            if *n > 0 {
                *n -= 1;
                tracing::debug!(method, "tikv double: dropping a response");
                return Err(Status::unavailable(format!(
                    "tikv double: {method} response dropped"
                )));
            }
        }
        Ok(Response::new(resp))
    }

    fn mvcc(&self) -> std::sync::MutexGuard<'_, Mvcc> {
        lock(&self.mvcc)
    }

    fn pd_header(&self) -> Option<pdpb::ResponseHeader> {
        Some(pdpb::ResponseHeader {
            cluster_id: CLUSTER_ID,
            error: None,
        })
    }

    fn member(&self) -> pdpb::Member {
        pdpb::Member {
            name: "pd-double".into(),
            member_id: MEMBER_ID,
            peer_urls: vec![self.url.clone()],
            client_urls: vec![self.url.clone()],
            ..Default::default()
        }
    }

    fn store(&self) -> metapb::Store {
        metapb::Store {
            id: STORE_ID,
            address: self.url.trim_start_matches("http://").to_string(),
            version: "8.5.0-double".into(),
            ..Default::default()
        }
    }

    fn region_response(&self, region: Option<&RegionDef>) -> pdpb::GetRegionResponse {
        pdpb::GetRegionResponse {
            header: self.pd_header(),
            region: region.map(RegionDef::meta),
            leader: region.map(RegionDef::peer),
            ..Default::default()
        }
    }

    /// Decodes a PD key (empty stays empty).
    fn pd_key(key: &[u8]) -> Result<Vec<u8>, Status> {
        if key.is_empty() {
            return Ok(Vec::new());
        }
        codec::decode(key).ok_or_else(|| Status::invalid_argument("key is not memcomparable"))
    }
}

pub(crate) async fn serve(cluster: Arc<Cluster>, listener: TcpListener) {
    // With its own listener tonic leaves Nagle on; small gRPC replies would
    // then wait for the client's delayed ACK (TiKV itself sets TCP_NODELAY).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |conn| {
            if let Ok(tcp) = &conn {
                let _ = tcp.set_nodelay(true);
            }
            conn
        },
    );
    let result = tonic::transport::Server::builder()
        .add_service(PdServer::from_arc(cluster.clone()))
        .add_service(TikvServer::from_arc(cluster))
        .serve_with_incoming(incoming)
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "tikv double: server stopped");
    }
}

type TsoStream = Pin<Box<dyn Stream<Item = Result<pdpb::TsoResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Pd for Cluster {
    async fn get_members(
        &self,
        _req: Request<pdpb::GetMembersRequest>,
    ) -> Result<Response<pdpb::GetMembersResponse>, Status> {
        self.before("GetMembers").await;
        let resp = pdpb::GetMembersResponse {
            header: self.pd_header(),
            members: vec![self.member()],
            leader: Some(self.member()),
            etcd_leader: Some(self.member()),
            ..Default::default()
        };
        self.deliver("GetMembers", resp)
    }

    type TsoStream = TsoStream;

    async fn tso(
        &self,
        req: Request<Streaming<pdpb::TsoRequest>>,
    ) -> Result<Response<Self::TsoStream>, Status> {
        self.before("Tso").await;
        let inbound = req.into_inner();
        // The stream outlives this call: it holds its own handle on the clock.
        let allocations = inbound.map({
            let clock = self.tso.clone();
            move |r| {
                let req = r?;
                let last = allocate_ts(&clock, req.count);
                Ok(pdpb::TsoResponse {
                    header: Some(pdpb::ResponseHeader {
                        cluster_id: CLUSTER_ID,
                        error: None,
                    }),
                    count: req.count,
                    timestamp: Some(pdpb::Timestamp {
                        physical: (last >> 18) as i64,
                        logical: (last & ((1 << 18) - 1)) as i64,
                        suffix_bits: 0,
                    }),
                })
            }
        });
        let stream: TsoStream = Box::pin(allocations);
        self.deliver("Tso", stream)
    }

    async fn get_store(
        &self,
        req: Request<pdpb::GetStoreRequest>,
    ) -> Result<Response<pdpb::GetStoreResponse>, Status> {
        self.before("GetStore").await;
        let id = req.into_inner().store_id;
        let resp = pdpb::GetStoreResponse {
            header: if id == STORE_ID {
                self.pd_header()
            } else {
                Some(pdpb::ResponseHeader {
                    cluster_id: CLUSTER_ID,
                    error: Some(pdpb::Error {
                        message: format!("store {id} not found"),
                        ..Default::default()
                    }),
                })
            },
            store: (id == STORE_ID).then(|| self.store()),
            stats: None,
        };
        self.deliver("GetStore", resp)
    }

    async fn get_all_stores(
        &self,
        _req: Request<pdpb::GetAllStoresRequest>,
    ) -> Result<Response<pdpb::GetAllStoresResponse>, Status> {
        self.before("GetAllStores").await;
        let resp = pdpb::GetAllStoresResponse {
            header: self.pd_header(),
            stores: vec![self.store()],
        };
        self.deliver("GetAllStores", resp)
    }

    async fn get_region(
        &self,
        req: Request<pdpb::GetRegionRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        self.before("GetRegion").await;
        let key = Self::pd_key(&req.into_inner().region_key)?;
        let resp = self.region_response(Some(self.region_by_key(&key)));
        self.deliver("GetRegion", resp)
    }

    async fn get_prev_region(
        &self,
        req: Request<pdpb::GetRegionRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        self.before("GetPrevRegion").await;
        let key = Self::pd_key(&req.into_inner().region_key)?;
        let idx = self.regions.iter().position(|r| r.contains(&key));
        let prev = idx.and_then(|i| i.checked_sub(1)).map(|i| &self.regions[i]);
        let resp = self.region_response(prev);
        self.deliver("GetPrevRegion", resp)
    }

    async fn get_region_by_id(
        &self,
        req: Request<pdpb::GetRegionByIdRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        self.before("GetRegionByID").await;
        let id = req.into_inner().region_id;
        let resp = self.region_response(self.regions.iter().find(|r| r.id == id));
        self.deliver("GetRegionByID", resp)
    }

    async fn scan_regions(
        &self,
        req: Request<pdpb::ScanRegionsRequest>,
    ) -> Result<Response<pdpb::ScanRegionsResponse>, Status> {
        self.before("ScanRegions").await;
        let req = req.into_inner();
        let start = Self::pd_key(&req.start_key)?;
        let end = Self::pd_key(&req.end_key)?;
        let limit = if req.limit <= 0 {
            usize::MAX
        } else {
            req.limit as usize
        };
        let hit: Vec<&RegionDef> = self
            .regions
            .iter()
            .filter(|r| {
                (r.end.is_empty() || r.end.as_slice() > start.as_slice())
                    && (end.is_empty() || r.start.as_slice() < end.as_slice())
            })
            .take(limit)
            .collect();
        let resp = pdpb::ScanRegionsResponse {
            header: self.pd_header(),
            region_metas: hit.iter().map(|r| r.meta()).collect(),
            leaders: hit.iter().map(|r| r.peer()).collect(),
            regions: hit
                .iter()
                .map(|r| pdpb::Region {
                    region: Some(r.meta()),
                    leader: Some(r.peer()),
                    ..Default::default()
                })
                .collect(),
        };
        self.deliver("ScanRegions", resp)
    }

    async fn get_gc_safe_point(
        &self,
        _req: Request<pdpb::GetGcSafePointRequest>,
    ) -> Result<Response<pdpb::GetGcSafePointResponse>, Status> {
        self.before("GetGCSafePoint").await;
        let resp = pdpb::GetGcSafePointResponse {
            header: self.pd_header(),
            safe_point: self.mvcc().gc_safe_point,
        };
        self.deliver("GetGCSafePoint", resp)
    }

    async fn update_gc_safe_point(
        &self,
        req: Request<pdpb::UpdateGcSafePointRequest>,
    ) -> Result<Response<pdpb::UpdateGcSafePointResponse>, Status> {
        self.before("UpdateGCSafePoint").await;
        // Unlike PD (which only records it for TiKV's GC workers), the double
        // collects garbage right away so that tests see its effect.
        let new = self.mvcc().gc(req.into_inner().safe_point);
        let resp = pdpb::UpdateGcSafePointResponse {
            header: self.pd_header(),
            new_safe_point: new,
        };
        self.deliver("UpdateGCSafePoint", resp)
    }
}

/// Allocates `count` timestamps from the clock; returns the last one.
fn allocate_ts(clock: &Mutex<u64>, count: u32) -> u64 {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut last = lock(clock);
    let first = (now_ms << 18).max(*last + 1);
    *last = first + u64::from(count.max(1)) - 1;
    *last
}

macro_rules! region_or_return {
    ($self:ident, $method:literal, $ctx:expr, $keys:expr, $resp:ty) => {
        match $self.check_region($ctx, $keys) {
            Ok(r) => r,
            Err(e) => {
                return $self.deliver($method, <$resp>::default().with_region_error(e));
            }
        }
    };
}

trait WithRegionError {
    fn with_region_error(self, e: errorpb::Error) -> Self;
}

macro_rules! with_region_error {
    ($($t:ty),*) => {$(
        impl WithRegionError for $t {
            fn with_region_error(mut self, e: errorpb::Error) -> Self {
                self.region_error = Some(e);
                self
            }
        }
    )*};
}

with_region_error!(
    kvrpcpb::GetResponse,
    kvrpcpb::ScanResponse,
    kvrpcpb::PrewriteResponse,
    kvrpcpb::CommitResponse,
    kvrpcpb::BatchGetResponse,
    kvrpcpb::BatchRollbackResponse,
    kvrpcpb::CleanupResponse,
    kvrpcpb::ScanLockResponse,
    kvrpcpb::ResolveLockResponse,
    kvrpcpb::TxnHeartBeatResponse,
    kvrpcpb::CheckTxnStatusResponse,
    kvrpcpb::CheckSecondaryLocksResponse,
    kvrpcpb::DeleteRangeResponse
);

/// Intersects a requested `[start, end)` with a region (empty end = unbounded).
fn clamp(region: &RegionDef, start: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let start = start.max(region.start.as_slice()).to_vec();
    let end = match (end.is_empty(), region.end.is_empty()) {
        (true, _) => region.end.clone(),
        (false, true) => end.to_vec(),
        (false, false) => end.min(region.end.as_slice()).to_vec(),
    };
    (start, end)
}

#[tonic::async_trait]
impl Tikv for Cluster {
    async fn kv_get(
        &self,
        req: Request<kvrpcpb::GetRequest>,
    ) -> Result<Response<kvrpcpb::GetResponse>, Status> {
        self.before("KvGet").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvGet",
            &req.context,
            [req.key.as_slice()],
            kvrpcpb::GetResponse
        );
        let mut resp = kvrpcpb::GetResponse::default();
        match self.mvcc().get(&req.key, req.version) {
            Ok(Some(v)) => resp.value = v,
            Ok(None) => resp.not_found = true,
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvGet", resp)
    }

    async fn kv_scan(
        &self,
        req: Request<kvrpcpb::ScanRequest>,
    ) -> Result<Response<kvrpcpb::ScanResponse>, Status> {
        self.before("KvScan").await;
        let req = req.into_inner();
        if req.reverse {
            return Err(Status::unimplemented("tikv double: reverse scan"));
        }
        let region = region_or_return!(
            self,
            "KvScan",
            &req.context,
            [req.start_key.as_slice()],
            kvrpcpb::ScanResponse
        );
        let (start, end) = clamp(region, &req.start_key, &req.end_key);
        let limit = if req.limit == 0 {
            usize::MAX
        } else {
            req.limit as usize
        };
        let pairs = self
            .mvcc()
            .scan(&start, &end, limit, req.version, req.key_only);
        let resp = kvrpcpb::ScanResponse {
            pairs,
            ..Default::default()
        };
        self.deliver("KvScan", resp)
    }

    async fn kv_prewrite(
        &self,
        req: Request<kvrpcpb::PrewriteRequest>,
    ) -> Result<Response<kvrpcpb::PrewriteResponse>, Status> {
        self.before("KvPrewrite").await;
        let req = req.into_inner();
        if req.use_async_commit || req.try_one_pc || !req.pessimistic_actions.is_empty() {
            return Err(Status::unimplemented(
                "tikv double: only optimistic two-phase commit",
            ));
        }
        region_or_return!(
            self,
            "KvPrewrite",
            &req.context,
            req.mutations.iter().map(|m| m.key.as_slice()),
            kvrpcpb::PrewriteResponse
        );
        let errors = self.mvcc().prewrite(
            &req.mutations,
            &req.primary_lock,
            req.start_version,
            req.lock_ttl,
            req.min_commit_ts,
            req.txn_size,
        );
        let resp = kvrpcpb::PrewriteResponse {
            errors,
            ..Default::default()
        };
        self.deliver("KvPrewrite", resp)
    }

    async fn kv_commit(
        &self,
        req: Request<kvrpcpb::CommitRequest>,
    ) -> Result<Response<kvrpcpb::CommitResponse>, Status> {
        self.before("KvCommit").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvCommit",
            &req.context,
            req.keys.iter().map(Vec::as_slice),
            kvrpcpb::CommitResponse
        );
        let mut resp = kvrpcpb::CommitResponse::default();
        match self
            .mvcc()
            .commit(&req.keys, req.start_version, req.commit_version)
        {
            Ok(()) => resp.commit_version = req.commit_version,
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvCommit", resp)
    }

    async fn kv_batch_get(
        &self,
        req: Request<kvrpcpb::BatchGetRequest>,
    ) -> Result<Response<kvrpcpb::BatchGetResponse>, Status> {
        self.before("KvBatchGet").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvBatchGet",
            &req.context,
            req.keys.iter().map(Vec::as_slice),
            kvrpcpb::BatchGetResponse
        );
        let mvcc = self.mvcc();
        let mut pairs = Vec::new();
        for key in &req.keys {
            match mvcc.get(key, req.version) {
                Ok(Some(value)) => pairs.push(kvrpcpb::KvPair {
                    error: None,
                    key: key.clone(),
                    value,
                }),
                Ok(None) => {}
                Err(e) => pairs.push(kvrpcpb::KvPair {
                    error: Some(e),
                    key: key.clone(),
                    value: Vec::new(),
                }),
            }
        }
        drop(mvcc);
        let resp = kvrpcpb::BatchGetResponse {
            pairs,
            ..Default::default()
        };
        self.deliver("KvBatchGet", resp)
    }

    async fn kv_batch_rollback(
        &self,
        req: Request<kvrpcpb::BatchRollbackRequest>,
    ) -> Result<Response<kvrpcpb::BatchRollbackResponse>, Status> {
        self.before("KvBatchRollback").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvBatchRollback",
            &req.context,
            req.keys.iter().map(Vec::as_slice),
            kvrpcpb::BatchRollbackResponse
        );
        let resp = kvrpcpb::BatchRollbackResponse {
            error: self
                .mvcc()
                .batch_rollback(&req.keys, req.start_version)
                .err(),
            ..Default::default()
        };
        self.deliver("KvBatchRollback", resp)
    }

    async fn kv_cleanup(
        &self,
        req: Request<kvrpcpb::CleanupRequest>,
    ) -> Result<Response<kvrpcpb::CleanupResponse>, Status> {
        self.before("KvCleanup").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvCleanup",
            &req.context,
            [req.key.as_slice()],
            kvrpcpb::CleanupResponse
        );
        let mut resp = kvrpcpb::CleanupResponse::default();
        let status =
            self.mvcc()
                .check_txn_status(&req.key, req.start_version, req.current_ts, true);
        match status {
            Ok((TxnStatus::Committed(ts), _, _)) => resp.commit_version = ts,
            Ok((TxnStatus::RolledBack, _, _)) => {}
            Ok((TxnStatus::Locked(_), _, info)) => {
                resp.error = Some(kvrpcpb::KeyError {
                    locked: info,
                    ..Default::default()
                })
            }
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvCleanup", resp)
    }

    async fn kv_scan_lock(
        &self,
        req: Request<kvrpcpb::ScanLockRequest>,
    ) -> Result<Response<kvrpcpb::ScanLockResponse>, Status> {
        self.before("KvScanLock").await;
        let req = req.into_inner();
        let region = region_or_return!(
            self,
            "KvScanLock",
            &req.context,
            [req.start_key.as_slice()],
            kvrpcpb::ScanLockResponse
        );
        let (start, end) = clamp(region, &req.start_key, &req.end_key);
        let limit = if req.limit == 0 {
            usize::MAX
        } else {
            req.limit as usize
        };
        let locks = self
            .mvcc()
            .locks_in(&start, &end, req.max_version, limit)
            .into_iter()
            .map(|(k, l)| l.info(&k))
            .collect();
        let resp = kvrpcpb::ScanLockResponse {
            locks,
            ..Default::default()
        };
        self.deliver("KvScanLock", resp)
    }

    async fn kv_resolve_lock(
        &self,
        req: Request<kvrpcpb::ResolveLockRequest>,
    ) -> Result<Response<kvrpcpb::ResolveLockResponse>, Status> {
        self.before("KvResolveLock").await;
        let req = req.into_inner();
        let region = region_or_return!(
            self,
            "KvResolveLock",
            &req.context,
            req.keys.iter().map(Vec::as_slice),
            kvrpcpb::ResolveLockResponse
        );
        let mut mvcc = self.mvcc();
        let txns: Vec<(u64, u64)> = if req.txn_infos.is_empty() {
            vec![(req.start_version, req.commit_version)]
        } else {
            req.txn_infos.iter().map(|t| (t.txn, t.status)).collect()
        };
        let mut error = None;
        for (start_ts, commit_ts) in txns {
            if let Err(e) = mvcc.resolve(&region.start, &region.end, &req.keys, start_ts, commit_ts)
            {
                error = Some(e);
                break;
            }
        }
        drop(mvcc);
        let resp = kvrpcpb::ResolveLockResponse {
            error,
            ..Default::default()
        };
        self.deliver("KvResolveLock", resp)
    }

    async fn kv_txn_heart_beat(
        &self,
        req: Request<kvrpcpb::TxnHeartBeatRequest>,
    ) -> Result<Response<kvrpcpb::TxnHeartBeatResponse>, Status> {
        self.before("KvTxnHeartBeat").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvTxnHeartBeat",
            &req.context,
            [req.primary_lock.as_slice()],
            kvrpcpb::TxnHeartBeatResponse
        );
        let mut resp = kvrpcpb::TxnHeartBeatResponse::default();
        match self
            .mvcc()
            .heartbeat(&req.primary_lock, req.start_version, req.advise_lock_ttl)
        {
            Ok(ttl) => resp.lock_ttl = ttl,
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvTxnHeartBeat", resp)
    }

    async fn kv_check_txn_status(
        &self,
        req: Request<kvrpcpb::CheckTxnStatusRequest>,
    ) -> Result<Response<kvrpcpb::CheckTxnStatusResponse>, Status> {
        self.before("KvCheckTxnStatus").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvCheckTxnStatus",
            &req.context,
            [req.primary_key.as_slice()],
            kvrpcpb::CheckTxnStatusResponse
        );
        let mut resp = kvrpcpb::CheckTxnStatusResponse::default();
        match self.mvcc().check_txn_status(
            &req.primary_key,
            req.lock_ts,
            req.current_ts,
            req.rollback_if_not_exist,
        ) {
            Ok((status, action, info)) => {
                resp.action = action as i32;
                resp.lock_info = info;
                match status {
                    TxnStatus::Committed(ts) => resp.commit_version = ts,
                    TxnStatus::RolledBack => {}
                    TxnStatus::Locked(ttl) => resp.lock_ttl = ttl,
                }
            }
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvCheckTxnStatus", resp)
    }

    async fn kv_check_secondary_locks(
        &self,
        req: Request<kvrpcpb::CheckSecondaryLocksRequest>,
    ) -> Result<Response<kvrpcpb::CheckSecondaryLocksResponse>, Status> {
        self.before("KvCheckSecondaryLocks").await;
        let req = req.into_inner();
        region_or_return!(
            self,
            "KvCheckSecondaryLocks",
            &req.context,
            req.keys.iter().map(Vec::as_slice),
            kvrpcpb::CheckSecondaryLocksResponse
        );
        let mut resp = kvrpcpb::CheckSecondaryLocksResponse::default();
        match self
            .mvcc()
            .check_secondary_locks(&req.keys, req.start_version)
        {
            Ok((locks, commit_ts)) => {
                resp.locks = locks;
                resp.commit_ts = commit_ts;
            }
            Err(e) => resp.error = Some(e),
        }
        self.deliver("KvCheckSecondaryLocks", resp)
    }

    async fn kv_delete_range(
        &self,
        req: Request<kvrpcpb::DeleteRangeRequest>,
    ) -> Result<Response<kvrpcpb::DeleteRangeResponse>, Status> {
        self.before("KvDeleteRange").await;
        let req = req.into_inner();
        let region = region_or_return!(
            self,
            "KvDeleteRange",
            &req.context,
            [req.start_key.as_slice()],
            kvrpcpb::DeleteRangeResponse
        );
        let (start, end) = clamp(region, &req.start_key, &req.end_key);
        if !req.notify_only {
            self.mvcc().delete_range(&start, &end);
        }
        self.deliver("KvDeleteRange", kvrpcpb::DeleteRangeResponse::default())
    }
}
