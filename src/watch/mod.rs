//! Watch cache: per resource, the current objects and a history of recent
//! events, fed only by the store's change feed; serves watches and cached
//! lists, and fans events out to watchers (each event's frames encoded once
//! per form and shared by all of them).

mod cache;
mod event;
mod feed;
mod history;
mod object;

pub use cache::{Cache, Filter, OnLoad, Page, Start, Subscription, WatchError};
pub use event::{frame, Conversion, WatchEvent};
pub use feed::{concat, EventRun, Feed};
pub use history::{
    HistoryLimits, DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_EVENTS, DEFAULT_HISTORY_WINDOW,
    DEFAULT_WATCHER_BYTES, DEFAULT_WATCHER_GRACE,
};
pub use object::CachedObject;

/// Splits a storage key `group/resource/namespace/name` into the resource id
/// (`group/resource`) and the object key within it (`namespace/name`).
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    let first = key.find('/')?;
    let second = first + 1 + key[first + 1..].find('/')?;
    Some((&key[..second], &key[second + 1..]))
}

#[cfg(test)]
mod tests {
    use super::split_key;

    #[test]
    fn splits_resource_and_object_key() {
        assert_eq!(
            split_key("demo.kshard.dev/widgets/ns/a"),
            Some(("demo.kshard.dev/widgets", "ns/a"))
        );
        assert_eq!(split_key("g/r//a"), Some(("g/r", "/a")));
        assert_eq!(split_key("g"), None);
    }
}
