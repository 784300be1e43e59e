//! An object's stored JSON, rendered on the request's own thread before the
//! write reaches the sequencer. The sequencer is one thread every write of
//! the shard passes through, so what it does per write bounds the shard's
//! write rate: serializing a 1 KiB object there was a quarter of its own
//! CPU. The revision, which only the sequencer knows, goes into the rendered
//! bytes at a placeholder: a copy instead of a serialization.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::Value;

use super::Revision;

/// An object's JSON with a placeholder for its resourceVersion.
#[derive(Debug)]
pub struct Rendered {
    json: Vec<u8>,
    /// Where the placeholder (inside the string's quotes) begins.
    at: usize,
}

/// The placeholder: random per process, so no client can put it into an
/// object, and free of anything JSON escapes, so it is written as it is.
fn placeholder() -> &'static str {
    static PLACEHOLDER: OnceLock<String> = OnceLock::new();
    PLACEHOLDER.get_or_init(|| format!("kshard-rv-{:032x}", rand::random::<u128>()))
}

/// The placeholder's searcher, built once (building one costs more than a search).
fn finder() -> &'static memchr::memmem::Finder<'static> {
    static FINDER: OnceLock<memchr::memmem::Finder<'static>> = OnceLock::new();
    FINDER.get_or_init(|| memchr::memmem::Finder::new(placeholder().as_bytes()))
}

impl Rendered {
    /// Renders `object` (which then carries the placeholder as its
    /// resourceVersion until `finish` replaces it). `None` when the object
    /// cannot be rendered here (no metadata, nested too deep for storage, a
    /// placeholder found twice): the sequencer then serializes it itself and
    /// refuses it in its own words.
    pub fn new(object: &mut Value) -> Option<Self> {
        super::nesting_within(object, super::MAX_OBJECT_NESTING)?;
        let placeholder = placeholder();
        object
            .get_mut("metadata")?
            .as_object_mut()?
            .insert("resourceVersion".into(), Value::String(placeholder.into()));
        let json = serde_json::to_vec(object).ok()?;
        let quoted = |at: usize| {
            at > 0
                && json.get(at - 1) == Some(&b'"')
                && json.get(at + placeholder.len()) == Some(&b'"')
        };
        let mut found = finder().find_iter(&json);
        let at = found.next().filter(|&at| quoted(at))?;
        if found.next().is_some() {
            return None;
        }
        Some(Self { json, at })
    }

    /// The bytes with `rev` in place of the placeholder.
    pub fn finish(&self, rev: Revision) -> Bytes {
        // Formatted on the stack: this runs on the sequencer, once per write.
        let mut digits = [0u8; 20];
        let rev = {
            use std::io::Write as _;
            let mut free = &mut digits[..];
            // u64::MAX has 20 digits: it always fits.
            let _ = write!(free, "{rev}");
            let used = 20 - free.len();
            &digits[..used]
        };
        let rest = self.at + placeholder().len();
        let mut out = Vec::with_capacity(self.json.len() - placeholder().len() + rev.len());
        out.extend_from_slice(&self.json[..self.at]);
        out.extend_from_slice(rev);
        out.extend_from_slice(&self.json[rest..]);
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finished_bytes_are_what_serializing_at_the_revision_writes() {
        let mut object = json!({
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "", "uid": "u"},
            "spec": {"resourceVersion": "not this one", "list": [1, {"x": "y"}]},
        });
        let rendered = Rendered::new(&mut object).expect("renders");
        for rev in [1, 42, u64::MAX] {
            object["metadata"]["resourceVersion"] = json!(rev.to_string());
            assert_eq!(rendered.finish(rev), serde_json::to_vec(&object).unwrap());
        }
    }

    #[test]
    fn objects_it_cannot_render_are_left_to_the_sequencer() {
        // No metadata to carry a resourceVersion.
        assert!(Rendered::new(&mut json!({"kind": "X"})).is_none());
        // Deeper than storage takes.
        let mut deep = json!(1);
        for _ in 0..super::super::MAX_OBJECT_NESTING + 1 {
            deep = json!([deep]);
        }
        assert!(Rendered::new(&mut json!({"metadata": {}, "spec": deep})).is_none());
        // The placeholder elsewhere in the object (only this process can know it).
        let mut twice = json!({"metadata": {}, "spec": {"copy": placeholder()}});
        assert!(Rendered::new(&mut twice).is_none());
    }
}
