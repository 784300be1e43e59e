//! What the machine's disks have written: the measure of a round's disk
//! writes, shared by `benches/etcd.rs` (kshard's rounds, and etcd's with its
//! own client) and this driver (etcd's rounds), which includes it by path.

/// Bytes the machine's disks have written (`/sys/block/*/stat`), once
/// everything written so far has reached them (`sync`). Only one server
/// works at a time, so a round's difference is that server's: its log, its
/// database's pages, the filesystem's journal for them. Per process,
/// `/proc/<pid>/io` is no measure: with large page-cache folios it counts a
/// whole folio each time an append dirties it again after a sync (70 KB per
/// 1.6 KB create at c=1, while the disk wrote 9).
pub fn disk_written() -> u64 {
    let _ = std::process::Command::new("sync").status();
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    devices
        .flatten()
        .filter(|d| {
            let name = d.file_name().to_string_lossy().into_owned();
            // Virtual devices repeat their backing devices' writes, or have none.
            !["loop", "ram", "zram", "dm-", "md"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .filter_map(|d| std::fs::read_to_string(d.path().join("stat")).ok())
        .filter_map(|stat| stat.split_whitespace().nth(6)?.parse::<u64>().ok())
        .sum::<u64>()
        * 512
}
