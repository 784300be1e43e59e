//! The log backend: one JSON event per line, to a file that is rotated by
//! size, with old files pruned by count and age (kube-apiserver's
//! `--audit-log-max{size,backup,age}`, which it implements with lumberjack:
//! backups are named `<name>-<UTC timestamp>.<ext>` beside the file; a size
//! of 0 means 100 MB; a count or age of 0 keeps every backup).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::event::Event;
use super::Sink;

const DEFAULT_MAX_SIZE_MB: u64 = 100;

pub struct LogSink {
    out: Mutex<Output>,
}

enum Output {
    Stdout,
    File(RotatingFile),
}

pub struct Rotation {
    pub max_size_bytes: u64,
    pub max_backups: usize,
    pub max_age: Option<Duration>,
}

impl Rotation {
    /// From kube's flags: sizes in megabytes, ages in days, 0 as lumberjack reads it.
    pub fn from_flags(max_size_mb: u64, max_backups: usize, max_age_days: u64) -> Self {
        let mb = if max_size_mb == 0 {
            DEFAULT_MAX_SIZE_MB
        } else {
            max_size_mb
        };
        Rotation {
            max_size_bytes: mb.saturating_mul(1024 * 1024),
            max_backups,
            max_age: (max_age_days > 0).then(|| Duration::from_secs(max_age_days * 86_400)),
        }
    }
}

struct RotatingFile {
    path: PathBuf,
    file: File,
    size: u64,
    rotation: Rotation,
}

impl LogSink {
    /// `-` writes to standard output.
    pub fn open(path: &Path, rotation: Rotation) -> std::io::Result<Self> {
        let out = if path == Path::new("-") {
            Output::Stdout
        } else {
            Output::File(RotatingFile::open(path, rotation)?)
        };
        Ok(LogSink {
            out: Mutex::new(out),
        })
    }
}

impl Sink for LogSink {
    fn process(&self, event: &Event) {
        let mut line = match serde_json::to_vec(event) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "encoding an audit event");
                return;
            }
        };
        line.push(b'\n');
        let Ok(mut out) = self.out.lock() else {
            return;
        };
        let written = match &mut *out {
            Output::Stdout => std::io::stdout().lock().write_all(&line),
            Output::File(f) => f.write(&line),
        };
        if let Err(e) = written {
            tracing::error!(error = %e, "writing the audit log");
        }
    }
}

impl RotatingFile {
    fn open(path: &Path, rotation: Rotation) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            file,
            size,
            rotation,
        })
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.rotation.max_size_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let mut at = chrono::Utc::now();
        let mut backup = backup_name(&self.path, at);
        // Two rotations within a millisecond must not overwrite a backup.
        while backup.exists() {
            at += chrono::Duration::milliseconds(1);
            backup = backup_name(&self.path, at);
        }
        std::fs::rename(&self.path, &backup)?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        self.prune();
        Ok(())
    }

    /// Removes backups beyond the count and older than the age limit.
    fn prune(&self) {
        let mut backups = self.backups();
        // Newest first: the timestamp in the name sorts as time does.
        backups.sort_by(|a, b| b.cmp(a));
        let now = SystemTime::now();
        for (i, b) in backups.iter().enumerate() {
            let too_many = self.rotation.max_backups > 0 && i >= self.rotation.max_backups;
            let too_old = self.rotation.max_age.is_some_and(|age| {
                std::fs::metadata(b)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|d| d > age)
            });
            if too_many || too_old {
                if let Err(e) = std::fs::remove_file(b) {
                    tracing::warn!(file = %b.display(), error = %e, "removing an old audit log");
                }
            }
        }
    }

    fn backups(&self) -> Vec<PathBuf> {
        let (stem, ext) = stem_and_ext(&self.path);
        let prefix = format!("{stem}-");
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&prefix)
                        && n.ends_with(&ext)
                        && n.len() > prefix.len() + ext.len()
                })
            })
            .collect()
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Audit events name users and objects: not for every local account.
        o.mode(0o600);
    }
    o.open(path)
}

fn stem_and_ext(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("audit.log");
    match name.rfind('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name.to_string(), String::new()),
    }
}

/// `audit.log` → `audit-2026-11-23T23-30-00.123.log`, as lumberjack names backups.
fn backup_name(path: &Path, at: chrono::DateTime<chrono::Utc>) -> PathBuf {
    let (stem, ext) = stem_and_ext(path);
    let stamp = at.format("%Y-%m-%dT%H-%M-%S%.3f");
    path.with_file_name(format!("{stem}-{stamp}{ext}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::policy::Level;

    fn event(n: usize) -> Event {
        let mut e = Event::new(Level::Metadata, format!("id-{n}"));
        e.verb = "get".into();
        e
    }

    #[test]
    fn writes_json_lines_and_rotates_by_size_keeping_max_backups() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("audit.log");
        let line_len = serde_json::to_vec(&event(0)).expect("json").len() as u64 + 1;
        let sink = LogSink::open(
            &path,
            Rotation {
                max_size_bytes: line_len * 3,
                max_backups: 2,
                max_age: None,
            },
        )
        .expect("open");
        for n in 0..10 {
            sink.process(&event(n));
        }
        let current = std::fs::read_to_string(&path).expect("read");
        let ids: Vec<String> = current
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON event per line");
                v["auditID"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        assert_eq!(ids, ["id-9"], "three per file: 0-2, 3-5, 6-8, then 9");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "the file and two backups: {names:?}");
        assert!(names
            .iter()
            .all(|n| n == "audit.log" || (n.starts_with("audit-") && n.ends_with(".log"))));
        // The oldest backup (0-2) was pruned; the newest holds 6-8.
        let newest = dir.path().join(&names[1]);
        let text = std::fs::read_to_string(newest).expect("backup");
        assert!(text.contains("id-6") && text.contains("id-8"), "{text}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "audit log readable by others: {mode:o}");
        }
    }

    #[test]
    fn flag_zeroes_mean_what_lumberjack_means() {
        let r = Rotation::from_flags(0, 0, 0);
        assert_eq!(r.max_size_bytes, 100 * 1024 * 1024);
        assert_eq!(r.max_backups, 0);
        assert!(r.max_age.is_none());
        assert_eq!(
            Rotation::from_flags(1, 3, 2).max_age,
            Some(Duration::from_secs(2 * 86_400))
        );
        let name = backup_name(
            Path::new("/var/log/audit.log"),
            chrono::DateTime::from_timestamp(0, 5_000_000).expect("time"),
        );
        assert_eq!(
            name,
            Path::new("/var/log/audit-1970-01-01T00-00-00.005.log")
        );
    }
}
