//! Garbage collection among this server's objects: ownerReferences with
//! background, foreground (`foregroundDeletion`) and orphan (`orphan`) cascading.
//! It keeps its own owner graph from the store's change feed, like kube's
//! garbage collector keeps one from informers.

use crate::object::MetaField;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::delete::{FINALIZER_FOREGROUND, FINALIZER_ORPHAN};
use super::preconditions::Preconditions;
use super::{
    DeleteOptions, FieldValidation, Propagation, Registry, Subresource, Target, WriteOptions,
};
use crate::object::{finalizers, is_deleting};
use crate::storage::{EventType, StorageError};
use crate::watch::split_key;

struct Node {
    resource: String,
    key: String,
    /// uids of owners whose kind this server serves (others are never collected).
    owners: Vec<String>,
    deleting: bool,
    finalizers: Vec<String>,
}

/// What the collector knows. Only objects it may act on are nodes: those
/// with owners this server serves, and those deleting with a
/// collector's finalizer. Of every other object it keeps just the uid (an
/// owner's existence is all a dependent needs), 16 bytes rather than a node:
/// the graph used to hold a few hundred bytes for each of millions of
/// objects that have no owner.
#[derive(Default)]
struct Graph {
    nodes: HashMap<String, Node>,
    dependents: HashMap<String, HashSet<String>>,
    present: Uids,
}

/// The uids of every object: parsed UUIDs (kshard generates them), any
/// other string as it is.
#[derive(Default)]
struct Uids {
    uuids: HashSet<u128>,
    other: HashSet<String>,
}

impl Uids {
    fn insert(&mut self, uid: &str) {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => {
                self.uuids.insert(u.as_u128());
            }
            Err(_) => {
                self.other.insert(uid.to_string());
            }
        }
    }

    fn remove(&mut self, uid: &str) {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => self.uuids.remove(&u.as_u128()),
            Err(_) => self.other.remove(uid),
        };
    }

    fn contains(&self, uid: &str) -> bool {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => self.uuids.contains(&u.as_u128()),
            Err(_) => self.other.contains(uid),
        }
    }
}

impl Node {
    /// Whether the collector may have to act on this object.
    fn collectable(&self) -> bool {
        !self.owners.is_empty()
            || (self.deleting
                && self
                    .finalizers
                    .iter()
                    .any(|f| f == FINALIZER_FOREGROUND || f == FINALIZER_ORPHAN))
    }
}

impl Graph {
    fn remove(&mut self, uid: &str) -> Option<Node> {
        let node = self.nodes.remove(uid)?;
        for o in &node.owners {
            if let Some(d) = self.dependents.get_mut(o) {
                d.remove(uid);
                if d.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        Some(node)
    }

    fn upsert(&mut self, uid: String, node: Node) {
        self.remove(&uid);
        self.present.insert(&uid);
        if !node.collectable() {
            return;
        }
        for o in &node.owners {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(uid.clone());
        }
        self.nodes.insert(uid, node);
    }

    fn dependents_of(&self, uid: &str) -> Vec<String> {
        self.dependents
            .get(uid)
            .map(|d| {
                d.iter()
                    .filter(|u| self.nodes.contains_key(*u))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

enum Action {
    Delete {
        uid: String,
    },
    DropFinalizer {
        uid: String,
        finalizer: &'static str,
    },
    Orphan {
        dependent: String,
        owner: String,
    },
}

fn gc_write_options() -> WriteOptions {
    WriteOptions {
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        manager: "kshard-garbage-collector".into(),
        caller: None,
        strict_duplicates: Vec::new(),
    }
}

/// Stored objects read and parsed at a time when the collector starts.
const LOAD_PAGE: usize = 2048;

pub fn spawn(registry: Arc<Registry>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = run(registry).await {
            tracing::error!(error = %e, "garbage collector stopped");
        }
    })
}

async fn run(registry: Arc<Registry>) -> Result<(), StorageError> {
    let (rev, mut feed) = registry.store.subscribe();
    let mut graph = Graph::default();
    let mut dirty: HashSet<String> = HashSet::new();
    // The store is read a page at a time, each parsed off the runtime's
    // workers: read whole, a million objects were a second copy of all their
    // JSON (1.3 GB) beside the watch cache's, parsed on a worker for seconds,
    // just as the server became ready.
    let mut after = None;
    loop {
        let page = registry
            .store
            .list_counting("", rev, after, Some(LOAD_PAGE), Arc::new(|_| true), false)
            .await?;
        after = page.continue_after;
        let values = tokio::task::spawn_blocking(move || {
            page.items
                .into_iter()
                .filter_map(|(key, json)| Some((key, serde_json::from_slice::<Value>(&json).ok()?)))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| StorageError::Engine(e.to_string()))?;
        for (key, v) in values {
            if let Some(uid) = observe(&registry, &mut graph, &key, &v) {
                dirty.insert(uid);
            }
        }
        if after.is_none() {
            break;
        }
    }
    loop {
        let actions = plan(&graph, std::mem::take(&mut dirty));
        for a in actions {
            execute(&registry, &graph, a).await;
        }
        let Some(batch) = feed.recv().await else {
            return Ok(());
        };
        for ev in &batch.events {
            if ev.kind == EventType::Deleted {
                let uid = ev
                    .object
                    .meta_field("uid")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                graph.present.remove(uid);
                if let Some(node) = graph.remove(uid) {
                    // Owners waiting in the foreground, and dependents that may be orphaned now.
                    dirty.extend(node.owners);
                }
                dirty.extend(graph.dependents_of(uid));
            } else if let Some(uid) = observe(&registry, &mut graph, &ev.key, &ev.object) {
                let owners = graph
                    .nodes
                    .get(&uid)
                    .map(|n| n.owners.clone())
                    .unwrap_or_default();
                dirty.extend(owners);
                dirty.insert(uid);
            }
        }
    }
}

/// Records an object in the graph; returns its uid when it is a node the
/// collector may act on (planning one that is not would find nothing).
fn observe(registry: &Registry, graph: &mut Graph, key: &str, v: &Value) -> Option<String> {
    let (resource, sub) = split_key(key)?;
    let uid = v.meta_field("uid").and_then(Value::as_str)?.to_string();
    let catalog = registry.catalog();
    let owners: Vec<String> = v
        .meta_field("ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter(|r| {
                    let api_version = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
                    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
                    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
                    catalog.find_by_kind(group, kind).is_some()
                })
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let deleting = is_deleting(v);
    if owners.is_empty() && !deleting {
        // Not collectable (nearly every object): only its uid is kept, so
        // the node's strings are not built only to be dropped.
        graph.remove(&uid);
        graph.present.insert(&uid);
        return None;
    }
    graph.upsert(
        uid.clone(),
        Node {
            resource: resource.to_string(),
            key: sub.to_string(),
            owners,
            deleting,
            finalizers: finalizers(v),
        },
    );
    Some(uid)
}

fn plan(graph: &Graph, dirty: HashSet<String>) -> Vec<Action> {
    let mut actions = Vec::new();
    for uid in dirty {
        let Some(node) = graph.nodes.get(&uid) else {
            continue;
        };
        if node.deleting && node.finalizers.iter().any(|f| f == FINALIZER_FOREGROUND) {
            let deps = graph.dependents_of(&uid);
            if deps.is_empty() {
                actions.push(Action::DropFinalizer {
                    uid: uid.clone(),
                    finalizer: FINALIZER_FOREGROUND,
                });
            } else {
                for d in deps {
                    if graph.nodes.get(&d).is_some_and(|n| !n.deleting) {
                        actions.push(Action::Delete { uid: d });
                    }
                }
            }
        }
        if node.deleting && node.finalizers.iter().any(|f| f == FINALIZER_ORPHAN) {
            for d in graph.dependents_of(&uid) {
                actions.push(Action::Orphan {
                    dependent: d,
                    owner: uid.clone(),
                });
            }
            actions.push(Action::DropFinalizer {
                uid: uid.clone(),
                finalizer: FINALIZER_ORPHAN,
            });
        }
        if !node.owners.is_empty()
            && !node.deleting
            && node.owners.iter().all(|o| !graph.present.contains(o))
        {
            actions.push(Action::Delete { uid: uid.clone() });
        }
    }
    actions
}

fn target_of(registry: &Registry, node: &Node) -> Option<(Target, String)> {
    let rt = registry
        .catalog()
        .resources
        .iter()
        .find(|r| r.id() == node.resource)?
        .clone();
    let (ns, name) = node.key.split_once('/')?;
    Some((
        Target {
            version: rt.storage_version.clone(),
            namespace: ns.to_string(),
            rt,
        },
        name.to_string(),
    ))
}

async fn execute(registry: &Registry, graph: &Graph, action: Action) {
    // With several replicas only the leader collects (every replica sees the
    // same events; a follower's writes would be refused anyway).
    if registry.store.is_follower() {
        return;
    }
    let result = match &action {
        Action::Delete { uid } => {
            let Some((t, name)) = graph.nodes.get(uid).and_then(|n| target_of(registry, n)) else {
                return;
            };
            let opts = DeleteOptions {
                preconditions: Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                },
                propagation: Some(Propagation::Background),
                ..Default::default()
            };
            registry.delete(&t, &name, &opts).await.map(|_| ())
        }
        Action::DropFinalizer { uid, finalizer } => {
            let Some((t, name)) = graph.nodes.get(uid).and_then(|n| target_of(registry, n)) else {
                return;
            };
            registry
                .update_with(&t, &name, Subresource::Main, &gc_write_options(), |cur| {
                    let mut v = cur.clone();
                    if let Some(list) = v
                        .pointer_mut("/metadata/finalizers")
                        .and_then(Value::as_array_mut)
                    {
                        list.retain(|f| f.as_str() != Some(finalizer));
                    }
                    Ok(v)
                })
                .await
                .map(|_| ())
        }
        Action::Orphan { dependent, owner } => {
            let Some((t, name)) = graph
                .nodes
                .get(dependent)
                .and_then(|n| target_of(registry, n))
            else {
                return;
            };
            registry
                .update_with(&t, &name, Subresource::Main, &gc_write_options(), |cur| {
                    let mut v = cur.clone();
                    if let Some(refs) = v
                        .pointer_mut("/metadata/ownerReferences")
                        .and_then(Value::as_array_mut)
                    {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner));
                    }
                    Ok(v)
                })
                .await
                .map(|_| ())
        }
    };
    if let Err(e) = result {
        if e.code != 404 && e.code != 409 {
            tracing::warn!(error = %e, "garbage collection step failed");
        }
    }
}
