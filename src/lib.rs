//! kshard: a Kubernetes API server shard for CRD-defined resource groups.

pub mod storage;
