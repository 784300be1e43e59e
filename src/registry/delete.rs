//! delete and deletecollection: preconditions, propagation finalizers, and
//! graceful deletion (marked with a deletionTimestamp while finalizers remain).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::guaranteed::{Attempts, Current, Plan};
use super::preconditions::Preconditions;
use super::read::Item;
use super::write_admission::{Caller, Operation, Step};
use super::{ReadAt, Registry, Selectors, Target};
use crate::object::now_rfc3339;
use crate::object::{finalizers, generation, is_deleting, meta_mut, meta_str, set_finalizers};
use crate::status::ApiError;

pub const FINALIZER_ORPHAN: &str = "orphan";
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub preconditions: Preconditions,
    pub propagation: Option<Propagation>,
    pub dry_run: bool,
    /// Who asks, for admission (`None`: kshard's own deletes, no webhooks).
    pub caller: Option<Arc<Caller>>,
}

pub enum DeleteOutcome {
    /// Removed now; the last state (in the request's version).
    Deleted(Item),
    /// Marked for deletion; finalizers pending.
    Pending(Item),
}

/// Which outcome a committed delete attempt answers with.
type Answer = fn(Item) -> DeleteOutcome;

impl Registry {
    pub async fn delete(
        &self,
        t: &Target,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        self.delete_admitted_as(t, name, name, opts).await
    }

    /// Deletes `name`; admission sees `admitted_name` (kube's deletecollection
    /// admits each object under the collection request's empty name).
    async fn delete_admitted_as(
        &self,
        t: &Target,
        name: &str,
        admitted_name: &str,
        opts: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        let mut answer = None;
        let mut attempts = Attempts::new(self, t, name);
        let item = loop {
            let read = attempts.read().await?;
            let current = read.as_ref();
            let decided: Result<Plan, ApiError> = async {
                let current =
                    current.ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
                opts.preconditions
                    .check_before_delete(t, name, &current.value)?;
                // kube: preconditions, then admission of the stored object
                // (mutating, then validating), then the deletion itself.
                let step = Step::new(
                    Operation::Delete,
                    admitted_name,
                    super::Subresource::Main,
                    Some(&current.value),
                );
                self.admit_delete(t, &step, opts.dry_run, opts.caller.as_deref())
                    .await?;
                let (plan, answered) = self.plan_delete(t, current, opts).await?;
                answer = Some(answered);
                Ok(plan)
            }
            .await;
            if let Some(item) = attempts.settle(current, decided).await? {
                break item;
            }
        };
        let answer = answer.ok_or_else(|| ApiError::internal("delete decided nothing"))?;
        Ok(answer(item))
    }

    /// Either removes the object (no finalizers left) or marks it deleted
    /// and sets the propagation finalizers.
    async fn plan_delete(
        &self,
        t: &Target,
        stored: &Current,
        opts: &DeleteOptions,
    ) -> Result<(Plan, Answer), ApiError> {
        let current = &stored.value;
        let mut fins = finalizers(current);
        let strategy = t.rt.strategy();
        let mut held = false;
        if let Some(fin) = strategy
            .deletion_finalizer()
            .filter(|_| !is_deleting(current))
        {
            if !fins.iter().any(|f| f == fin) {
                fins.push(fin.into());
            }
            held = true;
        }
        match opts.propagation {
            Some(Propagation::Orphan) => {
                fins.retain(|f| f != FINALIZER_FOREGROUND);
                if !fins.iter().any(|f| f == FINALIZER_ORPHAN) {
                    fins.push(FINALIZER_ORPHAN.into());
                }
            }
            Some(Propagation::Foreground) => {
                fins.retain(|f| f != FINALIZER_ORPHAN);
                if !fins.iter().any(|f| f == FINALIZER_FOREGROUND) {
                    fins.push(FINALIZER_FOREGROUND.into());
                }
            }
            Some(Propagation::Background) => {
                fins.retain(|f| f != FINALIZER_ORPHAN && f != FINALIZER_FOREGROUND);
            }
            None => {}
        }
        if fins.is_empty() {
            if opts.dry_run {
                let item = self.dry_run_item(t, current.clone()).await?;
                return Ok((Plan::Done(item), DeleteOutcome::Deleted));
            }
            return Ok((Plan::Delete, DeleteOutcome::Deleted));
        }
        let mut new = current.clone();
        set_finalizers(&mut new, &fins);
        if held {
            strategy.mark_deleting(&mut new);
        }
        if !is_deleting(current) {
            let g = generation(current);
            if let Some(m) = meta_mut(&mut new) {
                m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if g > 0 {
                    m.insert("generation".into(), json!(g + 1));
                }
            }
        }
        let plan = if stored.unchanged_by(&new) {
            let json = Bytes::from(serde_json::to_vec(current).map_err(ApiError::internal)?);
            Plan::Done(Item::new(current.clone(), json))
        } else if opts.dry_run {
            Plan::Done(self.dry_run_item(t, new).await?)
        } else {
            Plan::Update(new)
        };
        Ok((plan, DeleteOutcome::Pending))
    }

    /// Deletes every object of the collection that matches; returns them as they were.
    pub async fn delete_collection(
        &self,
        t: &Target,
        sel: &Selectors,
        opts: &DeleteOptions,
    ) -> Result<Vec<Item>, ApiError> {
        let listed = self.list(t, sel, &ReadAt::Consistent, None).await?;
        let mut out = Vec::with_capacity(listed.items.len());
        for item in listed.items {
            let name = meta_str(item.value(), "name").to_string();
            let mut target = t.clone();
            if t.rt.namespaced {
                target.namespace = meta_str(item.value(), "namespace").to_string();
            }
            match self.delete_admitted_as(&target, &name, "", opts).await {
                Ok(_) => out.push(
                    self.item(t, &Arc::new(item.value().clone()), item.json())
                        .await?,
                ),
                // Already gone: someone else deleted it meanwhile.
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
