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
    /// Owners whose kind this server serves.
    owners: Vec<Owner>,
    /// Whether it also names owners of kinds this server does not serve: it
    /// cannot tell whether they exist, so it never collects the object
    /// (kube's collector fails to resolve such an owner and leaves it be).
    foreign_owners: bool,
    deleting: bool,
    finalizers: Vec<String>,
}

struct Owner {
    uid: String,
    /// `blockOwnerDeletion`: an owner in foreground deletion waits for it.
    blocking: bool,
    /// The namespace (its id, see `Graph::namespaces`) the owner must be in:
    /// the dependent's for a namespaced kind, none (0) for a cluster-scoped
    /// one. kube resolves a reference by name in that namespace, so an
    /// object of that uid elsewhere is not this owner.
    namespace: u32,
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
    /// Namespace names to the small ids `present` keeps (0: none).
    namespaces: HashMap<String, u32>,
}

/// The uid of every object with its namespace's id: parsed UUIDs (kshard
/// generates them) as two words (24 bytes an entry, where a `u128`'s
/// alignment made 32), any other string as it is.
#[derive(Default)]
struct Uids {
    uuids: HashMap<[u64; 2], u32>,
    other: HashMap<String, u32>,
}

fn uuid_words(u: uuid::Uuid) -> [u64; 2] {
    let (hi, lo) = u.as_u64_pair();
    [hi, lo]
}

impl Uids {
    fn insert(&mut self, uid: &str, namespace: u32) {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => {
                self.uuids.insert(uuid_words(u), namespace);
            }
            Err(_) => {
                self.other.insert(uid.to_string(), namespace);
            }
        }
    }

    fn remove(&mut self, uid: &str) {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => self.uuids.remove(&uuid_words(u)),
            Err(_) => self.other.remove(uid),
        };
    }

    /// The namespace of the object with this uid, if there is one.
    fn namespace_of(&self, uid: &str) -> Option<u32> {
        match uuid::Uuid::parse_str(uid) {
            Ok(u) => self.uuids.get(&uuid_words(u)).copied(),
            Err(_) => self.other.get(uid).copied(),
        }
    }

    /// Whether `owner` exists where the reference to it points.
    fn has(&self, owner: &Owner) -> bool {
        self.namespace_of(&owner.uid) == Some(owner.namespace)
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

    fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Deleting in the foreground: waiting for its blocking dependents.
    fn deleting_dependents(&self) -> bool {
        self.deleting && self.has_finalizer(FINALIZER_FOREGROUND)
    }

    /// Whether it blocks the owner of uid `owner`, in namespace `namespace`.
    fn blocks(&self, owner: &str, namespace: Option<u32>) -> bool {
        self.owners
            .iter()
            .any(|o| o.uid == owner && o.blocking && Some(o.namespace) == namespace)
    }
}

impl Graph {
    fn remove(&mut self, uid: &str) -> Option<Node> {
        let node = self.nodes.remove(uid)?;
        for o in &node.owners {
            if let Some(d) = self.dependents.get_mut(&o.uid) {
                d.remove(uid);
                if d.is_empty() {
                    self.dependents.remove(&o.uid);
                }
            }
        }
        Some(node)
    }

    fn namespace_id(&mut self, namespace: &str) -> u32 {
        if namespace.is_empty() {
            return 0;
        }
        if let Some(id) = self.namespaces.get(namespace) {
            return *id;
        }
        let id = u32::try_from(self.namespaces.len() + 1).unwrap_or(u32::MAX);
        self.namespaces.insert(namespace.to_string(), id);
        id
    }

    /// Records `node` under `uid`; returns the node it replaces.
    fn upsert(&mut self, uid: String, namespace: u32, node: Node) -> Option<Node> {
        let former = self.remove(&uid);
        self.present.insert(&uid, namespace);
        if !node.collectable() {
            return former;
        }
        for o in &node.owners {
            self.dependents
                .entry(o.uid.clone())
                .or_default()
                .insert(uid.clone());
        }
        self.nodes.insert(uid, node);
        former
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
        propagation: Propagation,
    },
    DropFinalizer {
        uid: String,
        finalizer: &'static str,
    },
    /// Removes owner references from a dependent that stays.
    DropOwners {
        dependent: String,
        owners: Vec<String>,
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
            observe(&registry, &mut graph, &key, &v, &mut dirty);
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
                    dirty.extend(node.owners.into_iter().map(|o| o.uid));
                }
                dirty.extend(graph.dependents_of(uid));
            } else {
                observe(&registry, &mut graph, &ev.key, &ev.object, &mut dirty);
            }
        }
    }
}

/// Records an object in the graph and marks what must be planned again:
/// the object when the collector may act on it, and its owners, former and
/// present (an owner in foreground deletion may have been waiting only on it).
fn observe(
    registry: &Registry,
    graph: &mut Graph,
    key: &str,
    v: &Value,
    dirty: &mut HashSet<String>,
) {
    let Some((resource, sub)) = split_key(key) else {
        return;
    };
    let Some(uid) = v.meta_field("uid").and_then(Value::as_str) else {
        return;
    };
    let refs = v
        .meta_field("ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let deleting = is_deleting(v);
    let namespace = sub.split_once('/').map_or("", |(ns, _)| ns);
    let namespace_id = graph.namespace_id(namespace);
    if refs.is_empty() && !deleting {
        // Not collectable (nearly every object): only its uid is kept, so
        // the node's strings are not built only to be dropped.
        if let Some(former) = graph.remove(uid) {
            dirty.extend(former.owners.into_iter().map(|o| o.uid));
        }
        graph.present.insert(uid, namespace_id);
        return;
    }
    let catalog = registry.catalog();
    let mut owners = Vec::with_capacity(refs.len());
    let mut foreign_owners = false;
    for r in refs {
        let api_version = r.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(owner_uid) = r.get("uid").and_then(Value::as_str) else {
            continue;
        };
        let Some(owner_kind) = catalog.find_by_kind(group, kind) else {
            foreign_owners = true;
            continue;
        };
        if owner_kind.namespaced && namespace.is_empty() {
            // A cluster-scoped object cannot have a namespaced owner: kube
            // leaves such a reference unresolved and the object uncollected.
            foreign_owners = true;
            continue;
        }
        owners.push(Owner {
            uid: owner_uid.to_string(),
            blocking: r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true),
            namespace: if owner_kind.namespaced {
                namespace_id
            } else {
                0
            },
        });
    }
    dirty.extend(owners.iter().map(|o| o.uid.clone()));
    let node = Node {
        resource: resource.to_string(),
        key: sub.to_string(),
        owners,
        foreign_owners,
        deleting,
        finalizers: finalizers(v),
    };
    let collectable = node.collectable();
    if let Some(former) = graph.upsert(uid.to_string(), namespace_id, node) {
        dirty.extend(former.owners.into_iter().map(|o| o.uid));
    }
    if collectable {
        dirty.insert(uid.to_string());
    }
}

/// What the collector does about the objects in `dirty`, as kube's does:
/// an owner deleting in the foreground has its dependents collected and
/// loses its finalizer once no dependent blocks it (`blockOwnerDeletion`);
/// an owner deleting with `orphan` lets its dependents go; a dependent is
/// deleted when none of its owners is solid (present and not waiting on
/// its dependents), and otherwise only loses the references to owners that
/// are gone or waiting.
fn plan(graph: &Graph, dirty: HashSet<String>) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut dependents: HashSet<String> = HashSet::new();
    for uid in dirty {
        let Some(node) = graph.nodes.get(&uid) else {
            continue;
        };
        if node.deleting_dependents() {
            let deps = graph.dependents_of(&uid);
            let here = graph.present.namespace_of(&uid);
            let blocked = deps
                .iter()
                .any(|d| graph.nodes.get(d).is_some_and(|n| n.blocks(&uid, here)));
            if !blocked {
                actions.push(Action::DropFinalizer {
                    uid: uid.clone(),
                    finalizer: FINALIZER_FOREGROUND,
                });
            }
            dependents.extend(deps);
        }
        if node.deleting && node.has_finalizer(FINALIZER_ORPHAN) {
            for d in graph.dependents_of(&uid) {
                actions.push(Action::DropOwners {
                    dependent: d,
                    owners: vec![uid.clone()],
                });
            }
            actions.push(Action::DropFinalizer {
                uid: uid.clone(),
                finalizer: FINALIZER_ORPHAN,
            });
        }
        dependents.insert(uid);
    }
    for uid in dependents {
        plan_dependent(graph, uid, &mut actions);
    }
    actions
}

/// kube's `attemptToDeleteItem` for one dependent.
fn plan_dependent(graph: &Graph, uid: String, actions: &mut Vec<Action>) {
    let Some(node) = graph.nodes.get(&uid) else {
        return;
    };
    if node.deleting || node.owners.is_empty() || node.foreign_owners {
        return;
    }
    let mut solid = false;
    let mut waiting = false;
    let mut unneeded = Vec::new();
    for o in &node.owners {
        if !graph.present.has(o) {
            unneeded.push(o.uid.clone());
        } else if graph
            .nodes
            .get(&o.uid)
            .is_some_and(Node::deleting_dependents)
        {
            waiting = true;
            unneeded.push(o.uid.clone());
        } else {
            solid = true;
        }
    }
    if solid {
        if !unneeded.is_empty() {
            actions.push(Action::DropOwners {
                dependent: uid,
                owners: unneeded,
            });
        }
        return;
    }
    // An owner waits on this object and it has dependents of its own: they
    // go first, so the wait carries down the chain.
    let propagation = if waiting && !graph.dependents_of(&uid).is_empty() {
        Propagation::Foreground
    } else if node.has_finalizer(FINALIZER_ORPHAN) {
        Propagation::Orphan
    } else if node.has_finalizer(FINALIZER_FOREGROUND) {
        Propagation::Foreground
    } else {
        Propagation::Background
    };
    actions.push(Action::Delete { uid, propagation });
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
        Action::Delete { uid, propagation } => {
            let Some((t, name)) = graph.nodes.get(uid).and_then(|n| target_of(registry, n)) else {
                return;
            };
            let opts = DeleteOptions {
                preconditions: Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                },
                propagation: Some(*propagation),
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
        Action::DropOwners { dependent, owners } => {
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
                        refs.retain(|r| {
                            r.get("uid")
                                .and_then(Value::as_str)
                                .is_none_or(|u| !owners.iter().any(|o| o == u))
                        });
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
